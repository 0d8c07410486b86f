//! Support for `tests/parca.rs`: a real Parca server and a TLS server of
//! the test's own.

// Each test file uses its own part of the support code.
#![allow(dead_code)]

pub mod harness;
pub mod stripped;
pub mod tls_server;
