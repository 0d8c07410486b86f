//! Support for `tests/parca.rs`: a real Parca server and a TLS server of
//! the test's own.

pub mod harness;
pub mod tls_server;
