//! Logs on stderr, one event a line: logfmt (`key=value`, what journald
//! and Loki take as is) or JSON, filtered by `--log-level`.

use tracing_subscriber::{EnvFilter, layer::SubscriberExt, util::SubscriberInitExt};

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
    #[error("logging was already set up")]
    Init {
        #[source]
        source: tracing_subscriber::util::TryInitError,
    },
}

/// The filter of a `--log-level` (a level, or tracing directives such as
/// `info,firn::output=debug`).
pub fn filter(level: &str) -> Result<EnvFilter, LoggingError> {
    EnvFilter::try_new(level).map_err(|source| LoggingError::Level {
        level: level.to_owned(),
        source,
    })
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

    #[test]
    fn levels_and_directives_parse_and_garbage_does_not() {
        assert!(filter("info").is_ok());
        assert!(filter("warn,firn::output=debug").is_ok());
        let error = filter("very-loud[[").expect_err("invalid");
        assert!(error.to_string().contains("very-loud[["), "{error}");
    }
}
