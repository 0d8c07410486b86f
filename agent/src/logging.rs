//! Logs on stderr, one event a line: logfmt (`key=value`, what journald
//! and Loki take as is) or JSON, filtered by `--log-level`.

use tracing_subscriber::{
    EnvFilter, filter::LevelFilter, layer::SubscriberExt, util::SubscriberInitExt,
};

/// `--log-format`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    #[default]
    Logfmt,
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("invalid --log-level `{level}`")]
    Level {
        level: String,
        #[source]
        source: tracing_subscriber::filter::ParseError,
    },
    #[error(
        "`{directive}` is neither a log level ({levels}) nor \
         `target=level` (e.g. `info,firn::output=debug`)",
        levels = LEVELS
    )]
    Unknown { level: String, directive: String },
    #[error("logging was already set up")]
    Init {
        #[source]
        source: tracing_subscriber::util::TryInitError,
    },
}

/// The levels `--log-level` takes.
pub const LEVELS: &str = "off, error, warn, info, debug, trace";

/// The filter of a `--log-level` (a level, or tracing directives such as
/// `info,firn::output=debug`).
pub fn filter(level: &str) -> Result<EnvFilter, LoggingError> {
    check_level(level)?;
    let parse = |directives: &str| {
        EnvFilter::try_new(directives).map_err(|source| LoggingError::Level {
            level: level.to_owned(),
            source,
        })
    };
    let filter = parse(level)?;
    let above_error = filter
        .max_level_hint()
        .is_none_or(|max| max > LevelFilter::ERROR);
    if !above_error || level.contains("kube") {
        return Ok(filter);
    }
    parse(&format!("{level},{QUIET_LIBRARIES}"))
}

/// kube's client and watcher warn at every retry of a failing list or
/// watch, some with the API server's whole answer; firn logs those
/// failures itself, once per run of them. They say more only when a
/// `--log-level` directive names them.
const QUIET_LIBRARIES: &str = "kube_client=error,kube_runtime=error";

/// Checks a `--log-level` more strictly than the tracing filter does: each
/// comma-separated directive is a level or ends in `=level`. A bare word
/// that is no level (`warning`) would be taken as a target name, turning
/// every other line off, errors included.
pub fn check_level(level: &str) -> Result<(), LoggingError> {
    let is_level = |word: &str| {
        LEVELS
            .split(", ")
            .any(|name| name.eq_ignore_ascii_case(word.trim()))
    };
    for directive in level.split(',') {
        let level_part = directive
            .rsplit_once('=')
            .map_or(directive, |(_, level)| level);
        if !is_level(level_part) {
            return Err(LoggingError::Unknown {
                level: level.to_owned(),
                directive: directive.to_owned(),
            });
        }
    }
    EnvFilter::try_new(level)
        .map(drop)
        .map_err(|source| LoggingError::Level {
            level: level.to_owned(),
            source,
        })
}

/// An error and its causes on one line. A cause whose text its parent
/// already ends with (errors that print their source in their own
/// message, as kube's do) is not repeated.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut line = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !line.ends_with(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        source = cause.source();
    }
    line
}

/// Installs the global subscriber.
pub fn init(filter: EnvFilter, format: LogFormat) -> Result<(), LoggingError> {
    let registry = tracing_subscriber::registry().with(filter);
    let result = match format {
        LogFormat::Logfmt => registry
            .with(
                tracing_logfmt::builder()
                    .with_span_name(false)
                    .with_span_path(false)
                    .layer()
                    .with_writer(std::io::stderr),
            )
            .try_init(),
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false)
                    .with_span_list(false)
                    .with_writer(std::io::stderr),
            )
            .try_init(),
    };
    result.map_err(|source| LoggingError::Init { source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    enum Failure {
        #[error("reading the pods failed")]
        Plain(#[source] std::io::Error),
        #[error("listing failed: {0}")]
        Repeats(#[source] std::io::Error),
    }

    #[test]
    fn an_error_chain_names_each_cause_once() {
        let cause = || std::io::Error::other("no route to host");
        assert_eq!(
            error_chain(&Failure::Plain(cause())),
            "reading the pods failed: no route to host"
        );
        assert_eq!(
            error_chain(&Failure::Repeats(cause())),
            "listing failed: no route to host"
        );
    }

    #[test]
    fn kube_warns_only_when_named() {
        let shown = |level: &str| filter(level).expect("a filter").to_string();
        assert!(shown("info").contains("kube_client=error"));
        assert!(shown("debug,kube_runtime=debug").contains("kube_runtime=debug"));
        assert!(!shown("debug,kube_runtime=debug").contains("kube_client"));
        assert!(!shown("off").contains("kube"), "off stays off");
        assert!(!shown("error").contains("kube"));
    }

    #[test]
    fn levels_and_directives_parse_and_garbage_does_not() {
        assert!(filter("info").is_ok());
        assert!(filter("warn,firn::output=debug").is_ok());
        assert!(filter("DEBUG").is_ok());
        assert!(filter("firn=trace,off").is_ok());
        let error = filter("very-loud[[").expect_err("invalid");
        assert!(error.to_string().contains("very-loud[["), "{error}");
    }

    #[test]
    fn a_word_that_is_no_level_is_refused_naming_the_levels() {
        for typo in ["warning", "info,firn", "firn=loud", "", "info,"] {
            let error = check_level(typo).expect_err(typo).to_string();
            assert!(error.contains(LEVELS), "{typo}: {error}");
        }
    }
}
