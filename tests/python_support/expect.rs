//! Checks that report rather than stop: each says how one process fared,
//! so that one run shows every interpreter's figures or failure.

use super::frames::{Sample, describe_samples, share};

/// Fewer samples than this of a workload say too little to judge it.
pub const MIN_SAMPLES: i64 = 30;
/// The share of samples a check needs where a few may fall between calls.
pub const MOST: f64 = 0.90;

/// The outcome of one check of one process: its figures, or the failure.
pub type Check = Result<String, String>;

/// Asserts every check passed, showing each one's figures.
pub fn assert_all(what: &str, checks: Vec<Check>) {
    let mut failures = Vec::new();
    for check in checks {
        match check {
            Ok(figures) => eprintln!("{what}: {figures}"),
            Err(failure) => failures.push(failure),
        }
    }
    assert!(failures.is_empty(), "{what}:\n\n{}", failures.join("\n\n"));
}

/// `hits` of `total` reach `wanted`, with enough samples to say so.
pub fn expect_share(
    who: &str,
    what: &str,
    (hits, total): (i64, i64),
    wanted: f64,
    samples: &[&Sample],
) -> Check {
    let figures = format!(
        "{who}: {what} in {hits} of {total} ({:.1}%)",
        share((hits, total)) * 100.0
    );
    if total < MIN_SAMPLES {
        return Err(format!(
            "{figures}: too few samples\n{}",
            describe_samples(samples.iter().copied())
        ));
    }
    if share((hits, total)) < wanted {
        return Err(format!(
            "{figures}, wanted {:.0}%:\n{}",
            wanted * 100.0,
            describe_samples(samples.iter().copied())
        ));
    }
    Ok(figures)
}
