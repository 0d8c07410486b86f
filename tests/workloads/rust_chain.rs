//! The chain main > level_one > level_two > level_three > burn_leaf in
//! Rust, built by the unwinding tests as a release binary without frame
//! pointers. Each level works after its call so none becomes a tail call.

use std::hint::black_box;

#[inline(never)]
fn burn_leaf(rounds: u64) -> u64 {
    let mut x = black_box(rounds);
    for _ in 0..black_box(rounds) {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
    }
    x
}

#[inline(never)]
fn level_three(rounds: u64) -> u64 {
    let r = burn_leaf(rounds);
    black_box(r);
    r + 3
}

#[inline(never)]
fn level_two(rounds: u64) -> u64 {
    let r = level_three(rounds);
    black_box(r);
    r + 2
}

#[inline(never)]
fn level_one(rounds: u64) -> u64 {
    let r = level_two(rounds);
    black_box(r);
    r + 1
}

fn main() {
    let rounds = std::env::args()
        .nth(1)
        .and_then(|arg| arg.parse().ok())
        .unwrap_or(100_000);
    loop {
        black_box(level_one(rounds));
    }
}
