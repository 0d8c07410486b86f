//! Kernel structure offsets the BPF programs need, read from the running
//! kernel's BTF: firn's BPF object is built once, without CO-RE, so a field
//! whose place differs between kernel builds is located here and handed to
//! the program.
//!
//! Two offsets in `task_struct` are needed, so the type section is scanned
//! in place rather than parsed into owned types: a full parse of the
//! kernel's 5 MB of BTF (btf-rs) took 0.15 s of CPU at every start, the
//! scan takes a few milliseconds.

use std::{
    io::{self, Read},
    path::Path,
};

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("could not read the kernel's BTF at {path}")]
    Read {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("the kernel's BTF is malformed: {what}")]
    Malformed { what: &'static str },
    #[error("the kernel's BTF has no {what}")]
    Missing { what: &'static str },
}

/// The kernel's own BTF is a few MB; more is not BTF firn should trust.
const MAX_BTF_BYTES: u64 = 64 << 20;

/// Where the kernel's BTF describes the running kernel.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Byte offset of the user thread pointer in `task_struct`
/// (`thread.fsbase` on x86-64), through which a thread's TLS (and so an
/// interpreter's thread state) is found.
pub fn task_thread_pointer_offset(vmlinux: &Path) -> Result<u32, BtfError> {
    thread_pointer_offset_in(&read(vmlinux)?)
}

/// Byte offset of `tgid` in `task_struct`: the process id of a task, which
/// the BPF program reads from a task the kernel has just created.
pub fn task_tgid_offset(vmlinux: &Path) -> Result<u32, BtfError> {
    tgid_offset_in(&read(vmlinux)?)
}

/// Byte offset of `pid` (the thread id) in `task_struct`: where the
/// off-CPU program reads the id of the task coming on the CPU.
pub fn task_pid_offset(vmlinux: &Path) -> Result<u32, BtfError> {
    pid_offset_in(&read(vmlinux)?)
}

fn read(vmlinux: &Path) -> Result<Vec<u8>, BtfError> {
    let read_error = |source| BtfError::Read {
        path: vmlinux.display().to_string(),
        source,
    };
    let mut data = Vec::new();
    std::fs::File::open(vmlinux)
        .and_then(|file| file.take(MAX_BTF_BYTES).read_to_end(&mut data))
        .map_err(read_error)?;
    if data.len() as u64 >= MAX_BTF_BYTES {
        return Err(BtfError::Malformed {
            what: "larger than 64 MiB",
        });
    }
    Ok(data)
}

fn task_struct(btf: &Btf<'_>) -> Result<u32, BtfError> {
    btf.struct_named("task_struct").ok_or(BtfError::Missing {
        what: "struct task_struct",
    })
}

fn thread_pointer_offset_in(data: &[u8]) -> Result<u32, BtfError> {
    let btf = Btf::parse(data)?;
    let task = task_struct(&btf)?;
    let (thread, thread_bits) = btf.member(task, "thread", 0).ok_or(BtfError::Missing {
        what: "task_struct.thread",
    })?;
    let (_, fsbase_bits) = btf.member(thread, "fsbase", 0).ok_or(BtfError::Missing {
        what: "thread_struct.fsbase",
    })?;
    Ok((thread_bits + fsbase_bits) / 8)
}

fn tgid_offset_in(data: &[u8]) -> Result<u32, BtfError> {
    pid_t_offset_in(
        data,
        "tgid",
        ("task_struct.tgid", "task_struct.tgid as a 32-bit integer"),
    )
}

fn pid_offset_in(data: &[u8]) -> Result<u32, BtfError> {
    pid_t_offset_in(
        data,
        "pid",
        ("task_struct.pid", "task_struct.pid as a 32-bit integer"),
    )
}

/// The offset of `task_struct`'s `pid_t` member `name`; `what` names it
/// in the errors (missing, not 32 bits wide).
fn pid_t_offset_in(
    data: &[u8],
    name: &str,
    what: (&'static str, &'static str),
) -> Result<u32, BtfError> {
    let btf = Btf::parse(data)?;
    let task = task_struct(&btf)?;
    let (member, bits) = btf
        .member(task, name, 0)
        .ok_or(BtfError::Missing { what: what.0 })?;
    // The programs read a 32-bit pid_t, byte-aligned.
    match btf.header(member) {
        Some((_, info, 4)) if Btf::kind(info) == KIND_INT && bits % 8 == 0 => Ok(bits / 8),
        _ => Err(BtfError::Missing { what: what.1 }),
    }
}

/// The kernel functions `process_exit_maps` calls, in the order of its
/// markers: the VMA iterator (Linux 6.7) over the areas, the number
/// iterator (6.4) over each path's components.
pub const WALK_KFUNCS: [&str; 6] = [
    "bpf_iter_task_vma_new",
    "bpf_iter_task_vma_next",
    "bpf_iter_task_vma_destroy",
    "bpf_iter_num_new",
    "bpf_iter_num_next",
    "bpf_iter_num_destroy",
];

/// The offsets the exit walk reads (with `enabled` set) and the BTF ids of
/// [`WALK_KFUNCS`], or what the kernel lacks.
pub fn exit_walk(vmlinux: &Path) -> Result<(agent_common::MapsConfig, [u32; 6]), BtfError> {
    exit_walk_in(&read(vmlinux)?)
}

fn exit_walk_in(data: &[u8]) -> Result<(agent_common::MapsConfig, [u32; 6]), BtfError> {
    let btf = Btf::parse(data)?;
    let structure = |name: &'static str| {
        btf.struct_named(name)
            .ok_or(BtfError::Missing { what: name })
    };
    let offset = |id: u32, name: &str, what: &'static str| {
        btf.member(id, name, 0)
            .filter(|(_, bits)| bits % 8 == 0)
            .map(|(_, bits)| bits / 8)
            .ok_or(BtfError::Missing { what })
    };
    let task = task_struct(&btf)?;
    let vma = structure("vm_area_struct")?;
    let file = structure("file")?;
    let path = structure("path")?;
    let inode = structure("inode")?;
    let sb = structure("super_block")?;
    let dentry = structure("dentry")?;
    let qstr = structure("qstr")?;
    let hlist = structure("hlist_bl_node")?;
    let vfsmount = structure("vfsmount")?;
    let mount = structure("mount")?;
    let f_path = offset(file, "f_path", "file.f_path")?;
    let d_name = offset(dentry, "d_name", "dentry.d_name")?;
    let d_hash = offset(dentry, "d_hash", "dentry.d_hash")?;
    let config = agent_common::MapsConfig {
        enabled: 1,
        task_pid: offset(task, "pid", "task_struct.pid")?,
        task_tgid: offset(task, "tgid", "task_struct.tgid")?,
        vma_bytes: btf.header(vma).map_or(0, |(_, _, size)| size),
        vma_start: offset(vma, "vm_start", "vm_area_struct.vm_start")?,
        vma_end: offset(vma, "vm_end", "vm_area_struct.vm_end")?,
        vma_pgoff: offset(vma, "vm_pgoff", "vm_area_struct.vm_pgoff")?,
        vma_file: offset(vma, "vm_file", "vm_area_struct.vm_file")?,
        vma_flags: offset(vma, "vm_flags", "vm_area_struct.vm_flags")?,
        file_mnt: f_path + offset(path, "mnt", "path.mnt")?,
        file_dentry: f_path + offset(path, "dentry", "path.dentry")?,
        file_inode: offset(file, "f_inode", "file.f_inode")?,
        inode_ino: offset(inode, "i_ino", "inode.i_ino")?,
        inode_sb: offset(inode, "i_sb", "inode.i_sb")?,
        sb_dev: offset(sb, "s_dev", "super_block.s_dev")?,
        dentry_parent: offset(dentry, "d_parent", "dentry.d_parent")?,
        dentry_name: d_name + offset(qstr, "name", "qstr.name")?,
        dentry_hash_pprev: d_hash + offset(hlist, "pprev", "hlist_bl_node.pprev")?,
        vfsmount_root: offset(vfsmount, "mnt_root", "vfsmount.mnt_root")?,
        mount_mnt: offset(mount, "mnt", "mount.mnt")?,
        mount_parent: offset(mount, "mnt_parent", "mount.mnt_parent")?,
        mount_mountpoint: offset(mount, "mnt_mountpoint", "mount.mnt_mountpoint")?,
        // Only for registering interpreters at their exec: without it the
        // daemon registers them, a few milliseconds later.
        bprm_file: btf
            .struct_named("linux_binprm")
            .and_then(|binprm| btf.member(binprm, "file", 0))
            .filter(|(_, bits)| bits % 8 == 0)
            .map_or(0, |(_, bits)| bits / 8),
    };
    // The walk reads the area whole into a buffer of this size.
    let fields = [
        config.vma_start,
        config.vma_end,
        config.vma_pgoff,
        config.vma_file,
        config.vma_flags,
    ];
    if config.vma_bytes == 0 || fields.iter().any(|&at| at + 8 > config.vma_bytes.min(256)) {
        return Err(BtfError::Missing {
            what: "vm_area_struct fields within its first 256 bytes",
        });
    }
    let mut ids = [0; 6];
    for (id, name) in ids.iter_mut().zip(WALK_KFUNCS) {
        *id = btf.func_named(name).ok_or(BtfError::Missing {
            what: if name.starts_with("bpf_iter_num") {
                "the number iterator kfuncs (bpf_iter_num_*, Linux 6.4)"
            } else {
                "the VMA iterator kfuncs (bpf_iter_task_vma_*, Linux 6.7)"
            },
        })?;
    }
    Ok((config, ids))
}

const MAGIC: u16 = 0xeb9f;
const HEADER: usize = 24;
const TYPE: usize = 12;
const MEMBER: usize = 12;

const KIND_INT: u32 = 1;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_FUNC: u32 = 12;
/// Typedef, volatile, const, restrict, type tag: another name or
/// qualifier for the type they point to.
const KINDS_ALIAS: [u32; 5] = [8, 9, 10, 11, 18];

/// Anonymous members nest this deep at most (the kernel's are 2-3 deep).
const MAX_NESTING: u32 = 8;

/// The type and string sections of a BTF blob, and where each type starts.
struct Btf<'a> {
    types: &'a [u8],
    strings: &'a [u8],
    /// Start of type `id` in `types`, at `id - 1`.
    starts: Vec<u32>,
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    let field = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes(field.try_into().ok()?))
}

impl<'a> Btf<'a> {
    fn parse(data: &'a [u8]) -> Result<Self, BtfError> {
        let malformed = |what| BtfError::Malformed { what };
        let magic = data.get(..2).ok_or(malformed("no header"))?;
        if u16::from_le_bytes([magic[0], magic[1]]) != MAGIC {
            return Err(malformed("bad magic (or not little-endian)"));
        }
        let field = |at| {
            u32_at(data, at)
                .map(|v| v as usize)
                .ok_or(malformed("short header"))
        };
        let header_len = field(4)?;
        let section = |offset: usize, len: usize| {
            let start = header_len.checked_add(offset)?;
            data.get(start..start.checked_add(len)?)
        };
        let types =
            section(field(8)?, field(12)?).ok_or(malformed("type section out of bounds"))?;
        let strings =
            section(field(16)?, field(20)?).ok_or(malformed("string section out of bounds"))?;
        if header_len < HEADER {
            return Err(malformed("short header"));
        }
        let mut starts = Vec::new();
        let mut at = 0usize;
        while at < types.len() {
            let info = u32_at(types, at + 4).ok_or(malformed("truncated type"))?;
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            let trailing = match kind {
                1 | 14 | 17 => 4,
                3 => 12,
                4 | 5 | 15 | 19 => 12 * vlen,
                6 | 13 => 8 * vlen,
                2 | 7..=12 | 16 | 18 => 0,
                _ => return Err(malformed("unknown type kind")),
            };
            starts.push(u32::try_from(at).map_err(|_| malformed("type section too large"))?);
            at += TYPE + trailing;
        }
        if at != types.len() {
            return Err(malformed("truncated type"));
        }
        Ok(Self {
            types,
            strings,
            starts,
        })
    }

    fn name(&self, offset: u32) -> &'a [u8] {
        let rest = self.strings.get(offset as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        &rest[..end]
    }

    /// (name offset, info, size or type) of type `id`.
    fn header(&self, id: u32) -> Option<(u32, u32, u32)> {
        let start = *self.starts.get((id as usize).checked_sub(1)?)? as usize;
        Some((
            u32_at(self.types, start)?,
            u32_at(self.types, start + 4)?,
            u32_at(self.types, start + 8)?,
        ))
    }

    fn kind(info: u32) -> u32 {
        (info >> 24) & 0x1f
    }

    fn struct_named(&self, name: &str) -> Option<u32> {
        (1..=self.starts.len() as u32).find(|&id| {
            self.header(id).is_some_and(|(name_offset, info, _)| {
                Self::kind(info) == KIND_STRUCT && self.name(name_offset) == name.as_bytes()
            })
        })
    }

    fn func_named(&self, name: &str) -> Option<u32> {
        (1..=self.starts.len() as u32).find(|&id| {
            self.header(id).is_some_and(|(name_offset, info, _)| {
                Self::kind(info) == KIND_FUNC && self.name(name_offset) == name.as_bytes()
            })
        })
    }

    /// `id` with typedefs and qualifiers peeled off.
    fn resolve(&self, mut id: u32) -> Option<u32> {
        for _ in 0..32 {
            let (_, info, target) = self.header(id)?;
            if !KINDS_ALIAS.contains(&Self::kind(info)) {
                return Some(id);
            }
            id = target;
        }
        None
    }

    /// The member `name` of struct or union `id`, looking into anonymous
    /// structs and unions (where randomized or grouped fields sit): its
    /// resolved type and its offset in bits from the start of `id`.
    fn member(&self, id: u32, name: &str, depth: u32) -> Option<(u32, u32)> {
        if depth > MAX_NESTING {
            return None;
        }
        let (_, info, _) = self.header(id)?;
        if !matches!(Self::kind(info), KIND_STRUCT | KIND_UNION) {
            return None;
        }
        let bitfields = info >> 31 == 1;
        let start = *self.starts.get(id as usize - 1)? as usize + TYPE;
        for index in 0..(info & 0xffff) as usize {
            let at = start + index * MEMBER;
            let member_name = self.name(u32_at(self.types, at)?);
            let member_type = self.resolve(u32_at(self.types, at + 4)?)?;
            let raw_offset = u32_at(self.types, at + 8)?;
            let offset = if bitfields {
                raw_offset & 0x00ff_ffff
            } else {
                raw_offset
            };
            if member_name == name.as_bytes() {
                return Some((member_type, offset));
            }
            if member_name.is_empty()
                && let Some((found, inner)) = self.member(member_type, name, depth + 1)
            {
                return Some((found, offset + inner));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob: `struct thread_struct { long sp; long fsbase; }` and
    /// `struct task_struct { long state; union { long a; }; pid_t tgid;
    /// typedef'd thread_struct thread; }` with `thread` behind a const
    /// typedef and `tgid`'s type given as `tgid_type`.
    fn blob_with(tgid_type: u32) -> Vec<u8> {
        let strings =
            b"\0thread_struct\0sp\0fsbase\0task_struct\0state\0thread\0long\0ts_t\0tgid\0int\0pid_t\0";
        let name = |s: &str| {
            let needle = format!("\0{s}\0");
            strings
                .windows(needle.len())
                .position(|w| w == needle.as_bytes())
                .expect("name in table") as u32
                + 1
        };
        let mut types = Vec::new();
        let mut push = |words: &[u32]| {
            for word in words {
                types.extend_from_slice(&word.to_le_bytes());
            }
        };
        // 1: long (INT, 8 bytes, +4 encoding).
        push(&[name("long"), 1 << 24, 8, 64]);
        // 2: struct thread_struct { long sp; long fsbase; }
        push(&[name("thread_struct"), 4 << 24 | 2, 16]);
        push(&[name("sp"), 1, 0]);
        push(&[name("fsbase"), 1, 64]);
        // 3: union { long a } (anonymous), 4: typedef ts_t -> 2, 5: const -> 4
        push(&[0, 5 << 24 | 1, 8]);
        push(&[name("sp"), 1, 0]);
        push(&[name("ts_t"), 8 << 24, 2]);
        push(&[0, 10 << 24, 4]);
        // 6: struct task_struct { long state; union {..}; tgid; const ts_t thread; }
        push(&[name("task_struct"), 4 << 24 | 4, 48]);
        push(&[name("state"), 1, 0]);
        push(&[0, 3, 64]);
        push(&[name("tgid"), tgid_type, 160]);
        push(&[name("thread"), 5, 256]);
        // 7: int (INT, 4 bytes, signed), 8: typedef pid_t -> 7
        push(&[name("int"), 1 << 24, 4, 1 << 24 | 32]);
        push(&[name("pid_t"), 8 << 24, 7]);
        let mut data = Vec::new();
        data.extend_from_slice(&MAGIC.to_le_bytes());
        data.extend_from_slice(&[1, 0]);
        for word in [
            24u32,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            data.extend_from_slice(&word.to_le_bytes());
        }
        data.extend_from_slice(&types);
        data.extend_from_slice(strings);
        data
    }

    fn blob() -> Vec<u8> {
        blob_with(8)
    }

    #[test]
    fn finds_the_member_through_typedefs_and_qualifiers() {
        assert_eq!(
            thread_pointer_offset_in(&blob()).expect("found"),
            (256 + 64) / 8
        );
    }

    #[test]
    fn finds_tgid_through_its_typedef_and_wants_it_32_bits_wide() {
        assert_eq!(tgid_offset_in(&blob()).expect("found"), 160 / 8);
        // A `long tgid` is not what the program reads.
        assert!(matches!(
            tgid_offset_in(&blob_with(1)),
            Err(BtfError::Missing { .. })
        ));
    }

    #[test]
    fn malformed_blobs_are_errors_not_panics() {
        let data = blob();
        for len in 0..data.len() {
            let _ = thread_pointer_offset_in(&data[..len]);
            let _ = tgid_offset_in(&data[..len]);
            let _ = exit_walk_in(&data[..len]);
        }
        let mut bad = data.clone();
        bad[0] = 0;
        assert!(matches!(
            thread_pointer_offset_in(&bad),
            Err(BtfError::Malformed { .. })
        ));
    }

    #[test]
    fn thread_pointer_offset_of_the_running_kernel() {
        let path = Path::new(VMLINUX_BTF);
        assert!(
            path.exists(),
            "{VMLINUX_BTF} is missing: this test needs a kernel with BTF"
        );
        let offset = task_thread_pointer_offset(path).expect("offset found");
        // task_struct is several KiB; thread sits at its end.
        assert!(offset > 1024 && offset < 64 * 1024, "offset {offset}");
        assert_eq!(offset % 8, 0);
    }

    #[test]
    fn tgid_offset_of_the_running_kernel() {
        let offset = task_tgid_offset(Path::new(VMLINUX_BTF)).expect("offset found");
        // Among the ids, well inside the task, before the thread state.
        let thread = task_thread_pointer_offset(Path::new(VMLINUX_BTF)).expect("thread found");
        assert!(
            offset > 0 && offset < thread,
            "tgid at {offset}, thread at {thread}"
        );
        assert_eq!(offset % 4, 0);
    }

    #[test]
    fn missing_file_is_a_clear_error() {
        let error = task_thread_pointer_offset(Path::new("/nonexistent/vmlinux"))
            .expect_err("no such file");
        assert!(error.to_string().contains("/nonexistent/vmlinux"));
    }
}
