//! Following the processes a filtered process starts: the `follow_fork`
//! program on the `task/task_newtask` tracepoint adds each child to the
//! PID filter before it runs. Its record offsets are fixed in the BPF
//! program, so they are checked against the running kernel's format first.

use aya::{Ebpf, programs::TracePoint};
use tracing::{debug, warn};

use super::{load_logged, program_error, program_mut};
use agent_common::names;

/// Where tracefs is found (aya looks in the same places to attach).
const FORMAT_FILES: [&str; 2] = [
    "/sys/kernel/tracing/events/task/task_newtask/format",
    "/sys/kernel/debug/tracing/events/task/task_newtask/format",
];

/// The fields `follow_fork` reads, with the offsets it reads them at.
const EXPECTED_FIELDS: [(&str, u32); 2] = [("pid", 8), ("clone_flags", 32)];

/// Attaches `follow_fork`; without it only the given processes are
/// sampled, which is said once and is no reason to stop.
pub(super) fn attach(ebpf: &mut Ebpf) {
    match try_attach(ebpf) {
        Ok(()) => debug!("children of the profiled processes are followed"),
        Err(reason) => warn!(
            %reason,
            "processes started by the profiled ones will not be profiled"
        ),
    }
}

fn try_attach(ebpf: &mut Ebpf) -> Result<(), String> {
    let format = FORMAT_FILES
        .iter()
        .find_map(|path| std::fs::read_to_string(path).ok())
        .ok_or("tracefs is not mounted (task/task_newtask format unreadable)")?;
    check_format(&format)?;
    let name = names::PROG_FORK;
    let program: &mut TracePoint = program_mut(ebpf, name).map_err(|error| error.to_string())?;
    load_logged(program, name, TracePoint::load, TracePoint::info)
        .map_err(|error| error.to_string())?;
    program
        .attach("task", "task_newtask")
        .map_err(|source| program_error(name, source).to_string())?;
    Ok(())
}

/// Whether the tracepoint's record has the fields where `follow_fork`
/// reads them.
fn check_format(format: &str) -> Result<(), String> {
    for (field, offset) in EXPECTED_FIELDS {
        let found = format.lines().find_map(|line| {
            let mut parts = line.trim().split(';').map(str::trim);
            let declaration = parts.next()?.strip_prefix("field:")?;
            let name = declaration.rsplit(' ').next()?;
            if name != field {
                return None;
            }
            parts.find_map(|part| part.strip_prefix("offset:")?.parse::<u32>().ok())
        });
        match found {
            Some(found) if found == offset => {}
            Some(found) => {
                return Err(format!(
                    "task_newtask's `{field}` is at offset {found}, not {offset}"
                ));
            }
            None => return Err(format!("task_newtask has no field `{field}`")),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMAT: &str = "name: task_newtask
ID: 205
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:pid_t pid;\toffset:8;\tsize:4;\tsigned:1;
\tfield:char comm[16];\toffset:12;\tsize:16;\tsigned:0;
\tfield:u64 clone_flags;\toffset:32;\tsize:8;\tsigned:0;
";

    #[test]
    fn the_known_layout_passes_and_a_moved_field_does_not() {
        assert_eq!(check_format(FORMAT), Ok(()));
        let moved = FORMAT.replace("clone_flags;\toffset:32", "clone_flags;\toffset:40");
        assert!(
            check_format(&moved)
                .expect_err("refused")
                .contains("offset 40")
        );
        let missing = FORMAT.replace("pid_t pid;", "pid_t child;");
        assert!(
            check_format(&missing)
                .expect_err("refused")
                .contains("no field `pid`")
        );
    }
}
