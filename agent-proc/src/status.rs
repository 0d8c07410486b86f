//! `/proc/PID/status` (the fields firn reads of it) and
//! `/proc/PID/cmdline`. The process names itself and writes its own
//! arguments, so neither may make the parser panic.

/// The value of `field` (`Tgid`, `NSpid`, ...) in the status text.
fn field<'a>(status: &'a str, field: &str) -> Option<&'a str> {
    status.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
    })
}

/// The thread group (process) id: the pid of the process a thread is in.
pub fn tgid(status: &str) -> Option<u32> {
    field(status, "Tgid")?.trim().parse().ok()
}

/// The pid in the process's own (innermost) pid namespace: the last of
/// the `NSpid` field.
pub fn namespace_pid(status: &str) -> Option<u32> {
    field(status, "NSpid")?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

/// NUL-separated arguments as one line, cut at `max_bytes`.
pub fn command_line(bytes: &[u8], max_bytes: usize) -> String {
    let trimmed = bytes.strip_suffix(&[0]).unwrap_or(bytes);
    let cut = &trimmed[..trimmed.len().min(max_bytes)];
    String::from_utf8_lossy(cut).replace('\0', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_found_by_name() {
        let status = "Name:\tTgid: 9\nUmask:\t0022\nTgid:\t42\nPid:\t43\nNSpid:\t43\t7\n";
        assert_eq!(tgid(status), Some(42), "a name that looks like a field");
        assert_eq!(namespace_pid(status), Some(7));
        assert_eq!(namespace_pid("NSpid:\t12\n"), Some(12));
        for broken in [
            "",
            "Tgid:\n",
            "Tgid:\tx\n",
            "NSpid:\n",
            "NSpid:\t1 99999999999\n",
        ] {
            assert_eq!(
                (tgid(broken), namespace_pid(broken)),
                (None, None),
                "{broken:?}"
            );
        }
    }

    #[test]
    fn command_lines_are_joined_and_cut() {
        assert_eq!(command_line(b"a\0b c\0", 100), "a b c");
        assert_eq!(command_line(b"", 100), "");
        assert_eq!(command_line(&[b'x'; 10_000], 4096).len(), 4096);
        assert_eq!(command_line(&[0xff, 0, b'a'], 100), "\u{fffd} a");
    }
}
