//! Checks that report rather than stop: each says how one process fared,
//! so that one run shows every interpreter's figures or failure.

use super::frames::{Sample, count, describe_samples, share};

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

/// `good` holds for a share of `samples` (weighted by count) of at least
/// `wanted`, with enough samples to say so. A failure shows the samples
/// for which it does not.
pub fn expect_share(
    who: &str,
    what: &str,
    samples: &[&Sample],
    wanted: f64,
    good: impl Fn(&Sample) -> bool,
) -> Check {
    let (hits, total) = count(samples.iter().copied(), &good);
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
            "{figures}, wanted {:.0}%; the others:\n{}",
            wanted * 100.0,
            describe_samples(samples.iter().copied().filter(|sample| !good(sample)))
        ));
    }
    Ok(figures)
}
