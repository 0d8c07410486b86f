//! End to end: labels (placeholder while the tests are written).
