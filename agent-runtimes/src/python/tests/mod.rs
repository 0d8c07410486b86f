//! Tests against real interpreters: the DWARF layouts and the frames
//! captured from live processes (`fixtures/python/`).

mod captures;
mod dwarf;
mod shared;

use agent_fixtures::python::{INTERPRETERS, Interpreter};

use super::PythonVersion;

fn version_of(interpreter: &Interpreter) -> PythonVersion {
    let (major, minor) = interpreter.minor.split_once('.').expect("X.Y");
    PythonVersion {
        major: major.parse().expect("a major version"),
        minor: minor.parse().expect("a minor version"),
        patch: 0,
    }
}

fn interpreters() -> impl Iterator<Item = (PythonVersion, &'static Interpreter)> {
    INTERPRETERS
        .iter()
        .map(|interpreter| (version_of(interpreter), interpreter))
}
