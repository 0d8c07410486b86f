//! The namer replayed over memory captured from live `ruby` processes
//! (`fixtures/ruby/`), and over made-up processes (3.1's, 3.3's and
//! 3.4's) for what those do not show.

mod captures;
mod fields;
mod image;
mod names;
