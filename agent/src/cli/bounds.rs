//! The floors and ceilings of durations and sizes, and the log level
//! check: in clap's value parsers, so the config file and environment
//! variables get the same checks as the command line.

use std::time::Duration;

use super::parse_bytes;

/// Longer durations are refused: past any sensible setting, and timers
/// that far ahead would overflow the clock.
const MAX_DURATION: Duration = Duration::from_secs(366 * 24 * 60 * 60);
/// The shortest interval, network timeout or upload timeout: shorter ones
/// only turn into a flood of log lines, profiles or failed attempts.
const MIN_PERIOD: Duration = Duration::from_secs(1);
/// The smallest store or queue: about two profiles of one small process
/// (~500 bytes each). Less, down to 0, would drop every profile.
const MIN_STORE_BYTES: u64 = 1 << 10;

/// Any duration above zero (`firn record --duration`).
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text)
        .map_err(|error| format!("`{text}` is not a duration such as 10s or 1m30s ({error})"))?;
    if duration.is_zero() {
        return Err("the duration must be longer than zero".into());
    }
    if duration > MAX_DURATION {
        return Err(format!("`{text}` is too long: at most 366 days"));
    }
    Ok(duration)
}

/// `--profiling-duration`, and the timeouts: at least [`MIN_PERIOD`].
pub(super) fn parse_period(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration < MIN_PERIOD {
        return Err(format!("`{text}` is too short: at least 1s"));
    }
    Ok(duration)
}

/// `--off-cpu`'s period: each off-CPU sample stands for this much time
/// waited. Below 10µs a wait costs a sample nearly every time (the bound
/// on samples per second is the time waited over the period); above 4s
/// the BPF program's draw would overflow.
pub(super) fn parse_off_cpu_period(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text)?;
    if duration < Duration::from_micros(10) {
        return Err(format!("`{text}` is too short: at least 10us"));
    }
    if duration > Duration::from_secs(4) {
        return Err(format!("`{text}` is too long: at most 4s"));
    }
    Ok(duration)
}

/// `--local-store-max-bytes`, `--remote-store-queue-bytes`: at least 1KiB.
pub(super) fn parse_store_bytes(text: &str) -> Result<u64, String> {
    let bytes = parse_bytes(text)?;
    if bytes < MIN_STORE_BYTES {
        return Err(format!("`{text}` is too small: at least 1KiB"));
    }
    Ok(bytes)
}

/// `--log-level`: checked here, so a typo (`warning`, which the tracing
/// filter would take as a target name and so silence every line) is a
/// usage error, also in the config file and `FIRN_LOG_LEVEL`.
pub(super) fn parse_log_level(text: &str) -> Result<String, String> {
    crate::logging::check_level(text).map_err(|error| error.to_string())?;
    Ok(text.to_owned())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::cli::Cli;

    #[test]
    fn intervals_timeouts_and_queues_have_a_floor() {
        assert_eq!(parse_period("1s"), Ok(Duration::from_secs(1)));
        assert!(parse_period("999ms").is_err());
        assert_eq!(parse_store_bytes("1KiB"), Ok(1024));
        assert!(parse_store_bytes("0").is_err());
        for args in [
            vec!["firn", "--profiling-duration", "1ns"],
            vec!["firn", "--remote-store-queue-bytes", "0"],
            vec!["firn", "--remote-store-rpc-unary-timeout", "1ms"],
            vec!["firn", "--debuginfo-upload-timeout-duration", "1ms"],
            vec!["firn", "--local-store-max-bytes", "1"],
            vec!["firn", "--log-level", "warning"],
        ] {
            let error = Cli::try_parse_from(&args).expect_err("below the floor");
            assert_eq!(error.exit_code(), 2, "{args:?}");
        }
        let cli = Cli::try_parse_from(["firn", "--log-level", "info,firn::output=debug"])
            .expect("directives");
        assert_eq!(cli.log_level, "info,firn::output=debug");
    }
}
