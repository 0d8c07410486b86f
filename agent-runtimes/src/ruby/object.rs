//! Is a mapped object the CRuby interpreter, which one, and where its
//! statics are. Some of them are not exported (the symbol table, the
//! interpreter loop; since 3.3 the main ractor) and are found in the code
//! of exported functions that use them (`code.rs`).

use std::ops::Range;

use object::{Object, ObjectSection, ObjectSymbol};

use super::{
    RubyError, RubyVersion,
    code::{context_global, eval_loop, global_symbols},
    layout::layout,
};

/// The interpreter in an object: `libruby.so`, or an executable with it
/// linked in. Addresses are link-time ones (add the object's load bias).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RubyObject {
    pub version: RubyVersion,
    /// The global the running execution context is found through:
    /// `ruby_single_main_ractor` (3.0+), `ruby_current_execution_context_ptr`
    /// (2.x).
    pub context_global: u64,
    /// `ruby_global_symbols`, the symbol table (static, found through
    /// `rb_id2str`'s code).
    pub symbols: u64,
    /// `vm_exec_core`, the native interpreter loop whose frames the
    /// recorded control frames stand for (static, found as the largest
    /// function `rb_vm_exec` calls).
    pub eval_loop: Range<u64>,
}

const VERSION: &str = "ruby_version";
/// Exported by every libruby: an executable defining one has libruby
/// linked in (`rb_vm_exec` until 3.1, hidden since).
const EXEC: &str = "rb_vm_exec";
const EVAL_MAIN: &str = "rb_iseq_eval_main";

/// Bytes of a version string read at most.
const MAX_VERSION_BYTES: u64 = 32;

/// Whether the object named `file_name` (a path or a file name) with the
/// bytes `elf` is a CRuby interpreter: `Ok(None)` if not, an error if it
/// is one firn cannot walk.
///
/// An interpreter is named `libruby*.so*`, or defines `rb_vm_exec` or
/// `rb_iseq_eval_main` (an executable with libruby linked in exports them
/// for extensions): the `ruby` that only loads `libruby.so` is not one.
pub fn inspect_object(file_name: &str, elf: &[u8]) -> Result<Option<RubyObject>, RubyError> {
    let file_name = file_name.rsplit('/').next().unwrap_or(file_name);
    let named = file_name.starts_with("libruby") && file_name.contains(".so");
    let file = match object::File::parse(elf) {
        Ok(file) => file,
        Err(source) if named => return Err(RubyError::Parse { source }),
        Err(_) => return Ok(None),
    };
    let defines_exec = || {
        [EXEC, EVAL_MAIN]
            .iter()
            .any(|name| has_string(&file, name) && find_symbol(&file, name).is_some())
    };
    if !named && !defines_exec() {
        return Ok(None);
    }
    let version = read_version(&file)?;
    let layout = layout(version)?;
    Ok(Some(RubyObject {
        version,
        context_global: context_global(&file, layout.context_symbol)?,
        symbols: global_symbols(&file)?,
        eval_loop: eval_loop(&file)?,
    }))
}

/// The version `ruby_version` says.
fn read_version(file: &object::File<'_>) -> Result<RubyVersion, RubyError> {
    let symbol = find_symbol(file, VERSION).ok_or(RubyError::MissingSymbol { name: VERSION })?;
    let address = symbol.address();
    let length = match symbol.size() {
        0 => MAX_VERSION_BYTES,
        size => size.min(MAX_VERSION_BYTES),
    };
    let bytes = symbol
        .section_index()
        .and_then(|index| file.section_by_index(index).ok())
        .and_then(|section| bytes_at(&section, address, length))
        .ok_or(RubyError::UnreadableSymbol {
            name: VERSION,
            address,
        })?;
    let text = bytes.split(|&byte| byte == 0).next().unwrap_or_default();
    let text = String::from_utf8_lossy(text);
    RubyVersion::parse(&text).ok_or_else(|| RubyError::UnknownVersion {
        text: text.into_owned(),
    })
}

/// Whether a symbol string table of the file holds `name`: most objects
/// are not interpreters, and a search of the tables answers sooner than
/// reading each symbol's name.
fn has_string(file: &object::File<'_>, name: &str) -> bool {
    let needle = [b"\0", name.as_bytes(), b"\0"].concat();
    [".dynstr", ".strtab"].iter().any(|table| {
        file.section_by_name(table)
            .and_then(|section| section.data().ok())
            .is_some_and(|data| memchr::memmem::find(data, &needle).is_some())
    })
}

pub(super) fn find_symbol<'data, 'file>(
    file: &'file object::File<'data>,
    name: &str,
) -> Option<object::Symbol<'data, 'file>> {
    file.dynamic_symbols()
        .chain(file.symbols())
        .find(|symbol| symbol.is_definition() && symbol.name() == Ok(name))
}

/// Up to `length` bytes of `section` from `address` (fewer at its end).
pub(super) fn bytes_at<'data>(
    section: &object::Section<'data, '_>,
    address: u64,
    length: u64,
) -> Option<&'data [u8]> {
    // Section fields come from the file: an end past the address space
    // must not wrap.
    let end = section.address().saturating_add(section.size());
    let available = end.checked_sub(address)?;
    if address < section.address() || available == 0 {
        return None;
    }
    section
        .data_range(address, available.min(length))
        .ok()
        .flatten()
}

/// The section holding `address`.
pub(super) fn section_at<'data, 'file>(
    file: &'file object::File<'data>,
    address: u64,
) -> Option<object::Section<'data, 'file>> {
    file.sections().find(|section| {
        (section.address()..section.address().saturating_add(section.size())).contains(&address)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stand-ins for libruby (`fixtures/ruby/make-objects.sh`).
    fn stand_in(file: &str) -> Vec<u8> {
        let path = agent_fixtures::dir().join("ruby/objects").join(file);
        std::fs::read(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
    }

    const RUBY_3_1_2: RubyVersion = RubyVersion {
        major: 3,
        minor: 1,
        patch: 2,
    };

    #[test]
    fn statics_are_found_in_the_code() {
        let found = inspect_object(
            "/usr/lib/libruby-3.1.so.3.1.2",
            &stand_in("libruby-3.1.so.3.1.2"),
        )
        .expect("an interpreter")
        .expect("walkable");
        assert_eq!(
            found,
            RubyObject {
                version: RUBY_3_1_2,
                context_global: 0x5040,
                symbols: 0x5020,
                eval_loop: 0x105c..0x2012,
            }
        );
        // The symbols, not the name, make an interpreter.
        let renamed = inspect_object("ruby-static", &stand_in("libruby-3.1.so.3.1.2"))
            .expect("an interpreter")
            .expect("walkable");
        assert_eq!(renamed, found);
    }

    /// 3.3 and 3.4 hide `ruby_single_main_ractor` and `rb_vm_exec`; in
    /// 3.4.11 the comparison with `last_id` is behind a branch.
    #[test]
    fn hidden_statics_are_found_in_the_code() {
        let found = inspect_object(
            "/usr/lib/libruby-3.4.so.3.4.11",
            &stand_in("libruby-3.4.so.3.4.11"),
        )
        .expect("an interpreter")
        .expect("walkable");
        assert_eq!(
            found,
            RubyObject {
                version: RubyVersion {
                    major: 3,
                    minor: 4,
                    patch: 11,
                },
                context_global: 0x5040,
                symbols: 0x5020,
                eval_loop: 0x105e..0x2014,
            }
        );
        // rb_iseq_eval_main, exported, makes an interpreter too.
        let renamed = inspect_object("ruby-static", &stand_in("libruby-3.4.so.3.4.11"))
            .expect("an interpreter")
            .expect("walkable");
        assert_eq!(renamed, found);
    }

    #[test]
    fn the_eval_loop_is_never_a_plt_entry() {
        // vm_exec_core of 18 bytes, the PLT's FDE 32: still the loop.
        let found = inspect_object("libruby-3.1.so.3.1", &stand_in("libruby-3.1-small-loop.so"))
            .expect("an interpreter")
            .expect("walkable");
        assert_eq!(found.eval_loop, 0x105c..0x106e);
    }

    #[test]
    fn interpreters_firn_cannot_walk() {
        assert!(matches!(
            inspect_object("libruby-3.2.so.3.2", &stand_in("libruby-3.2.so.3.2.3")),
            Err(RubyError::UnsupportedVersion { version }) if version.to_string() == "3.2.3"
        ));
        // 2.7 is found by its own global, which a 3.x has not.
        assert!(matches!(
            inspect_object("libruby-2.7.so.2.7", &stand_in("libruby-2.7.so.2.7.8")),
            Err(RubyError::MissingSymbol {
                name: "ruby_current_execution_context_ptr"
            })
        ));
        assert!(matches!(
            inspect_object("libruby-3.1.so", &stand_in("libruby-3.1-no-last-id.so")),
            Err(RubyError::SymbolTableNotFound {
                function: "rb_id2str",
                ..
            })
        ));
        assert!(matches!(
            inspect_object("libruby.so.3.1", agent_fixtures::CHAIN),
            Err(RubyError::MissingSymbol {
                name: "ruby_version"
            })
        ));
        assert!(matches!(
            inspect_object("libruby.so.3.1", b"garbage"),
            Err(RubyError::Parse { .. })
        ));
    }

    #[test]
    fn other_objects_are_not_interpreters() {
        assert_eq!(
            inspect_object("chain", agent_fixtures::CHAIN).ok(),
            Some(None)
        );
        assert_eq!(inspect_object("ruby", b"garbage").ok(), Some(None));
        assert_eq!(
            inspect_object("/usr/bin/ruby3.1", agent_fixtures::CHAIN_STRIPPED).ok(),
            Some(None)
        );
    }

    #[test]
    fn versions() {
        assert_eq!(RubyVersion::parse("3.1.2"), Some(RUBY_3_1_2));
        assert_eq!(RUBY_3_1_2.to_string(), "3.1.2");
        for other in ["3.1", "3.1.2.1", "3.x.2", "", "3.1.256"] {
            assert_eq!(RubyVersion::parse(other), None, "{other}");
        }
    }

    /// Debian 12's libruby 3.1 (`libruby3.1` 3.1.7+really3.1.2-0+deb12u1),
    /// where that very build is installed: the values checked by hand with
    /// objdump (`fixtures/README.md`).
    #[test]
    fn debian_libruby_3_1_where_installed() {
        let path = "/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1.2";
        let elf = std::fs::read(path).unwrap_or_default();
        let build_id = object::File::parse(&*elf)
            .ok()
            .and_then(|file| file.build_id().ok().flatten())
            .map(|id| {
                id.iter()
                    .map(|byte| format!("{byte:02x}"))
                    .collect::<String>()
            });
        let same = build_id.as_deref() == Some("862794fba1ac9d77263f555b39818ec3baacbeb8");
        if !same {
            eprintln!("{path} is not the build checked: not checked");
            return;
        }
        let found = inspect_object(path, &elf)
            .expect("an interpreter")
            .expect("walkable");
        assert_eq!(
            found,
            RubyObject {
                version: RUBY_3_1_2,
                context_global: 0x3b_d368,
                symbols: 0x3a_f1c0,
                eval_loop: 0x24_ebd0..0x25_3047,
            }
        );
    }

    /// The libruby of a chroot `cargo xtask setup` makes (under
    /// `FIRN_RUBY_CHROOTS`, by default `~/.cache/firn/ruby-chroots`), if it
    /// is the build whose values were checked by hand with objdump
    /// (`fixtures/README.md`); `None` if not there.
    fn chroot_libruby(suite: &str, file: &str, build_id: &str) -> Option<Vec<u8>> {
        let chroots = std::env::var_os("FIRN_RUBY_CHROOTS").map_or_else(
            || {
                let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
                std::path::PathBuf::from(home).join(".cache/firn/ruby-chroots")
            },
            std::path::PathBuf::from,
        );
        let path = chroots
            .join(suite)
            .join("usr/lib/x86_64-linux-gnu")
            .join(file);
        let elf = std::fs::read(&path).ok()?;
        let id = object::File::parse(&*elf)
            .ok()
            .and_then(|file| file.build_id().ok().flatten())
            .map(|id| {
                id.iter()
                    .map(|byte| format!("{byte:02x}"))
                    .collect::<String>()
            });
        if id.as_deref() != Some(build_id) {
            eprintln!("{} is not the build checked: not checked", path.display());
            return None;
        }
        Some(elf)
    }

    /// Debian 11's libruby 2.7 (`libruby2.7` 2.7.4-1+deb11u1), Debian 13's
    /// 3.3 (`libruby3.3` 3.3.8-2) and experimental's 3.4 (`libruby3.4`
    /// 3.4.11-1~exp1), which export neither `ruby_single_main_ractor` nor
    /// `rb_vm_exec`.
    #[test]
    fn debian_libruby_2_7_3_3_and_3_4_where_installed() {
        let checked = [
            (
                "bullseye",
                "libruby-2.7.so.2.7.4",
                "82fea422538a51208c1a9ac87cfd303eece65582",
                (2, 7, 4),
                0x35_a8b0,
                0x34_31e0,
                0x22_1680..0x22_70ee,
            ),
            (
                "trixie",
                "libruby-3.3.so.3.3.8",
                "f15efb61d1a23f302e244b44c3861b3540113d23",
                (3, 3, 8),
                0x46_bbe0,
                0x45_b160,
                0x27_8fd0..0x27_df8f,
            ),
            (
                "sid",
                "libruby-3.4.so.3.4.11",
                "d9c7dd4541f5e827045c454658198e903e1c5028",
                (3, 4, 11),
                0x4e_caa8,
                0x4d_c180,
                0x2b_3520..0x2b_8f7f,
            ),
        ];
        for (suite, file, build_id, (major, minor, patch), context_global, symbols, eval_loop) in
            checked
        {
            let Some(elf) = chroot_libruby(suite, file, build_id) else {
                continue;
            };
            let found = inspect_object(file, &elf)
                .expect("an interpreter")
                .expect("walkable");
            assert_eq!(
                found,
                RubyObject {
                    version: RubyVersion {
                        major,
                        minor,
                        patch,
                    },
                    context_global,
                    symbols,
                    eval_loop,
                },
                "{file}"
            );
        }
    }
}
