//! The namer replayed over memory captured from live `ruby` processes
//! (`fixtures/ruby/`), and over a made-up process for what those do not
//! show.

mod captures;
mod image;
mod names;
