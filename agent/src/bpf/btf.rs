//! Kernel structure offsets the BPF programs need, read from the running
//! kernel's BTF: firn's BPF object is built once, without CO-RE, so a field
//! whose place differs between kernel builds is located here and handed to
//! the program in its config.

use std::path::Path;

use btf_rs::{Btf, Type};

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("could not read the kernel's BTF at {path}")]
    Read {
        path: String,
        #[source]
        source: btf_rs::Error,
    },
    #[error("the kernel's BTF has no {what}")]
    Missing { what: &'static str },
}

/// Where the kernel's BTF describes the running kernel.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Byte offset of the user thread pointer in `task_struct`
/// (`thread.fsbase` on x86-64), through which a thread's TLS (and so an
/// interpreter's thread state) is found.
pub fn task_thread_pointer_offset(vmlinux: &Path) -> Result<u32, BtfError> {
    let btf = Btf::from_file(vmlinux).map_err(|source| BtfError::Read {
        path: vmlinux.display().to_string(),
        source,
    })?;
    let task = btf
        .resolve_types_by_name("task_struct")
        .ok()
        .and_then(|types| types.into_iter().find(|t| matches!(t, Type::Struct(_))))
        .ok_or(BtfError::Missing {
            what: "struct task_struct",
        })?;
    let (thread, thread_bits) = member(&btf, &task, "thread").ok_or(BtfError::Missing {
        what: "task_struct.thread",
    })?;
    let (_, fsbase_bits) = member(&btf, &thread, "fsbase").ok_or(BtfError::Missing {
        what: "thread_struct.fsbase",
    })?;
    Ok((thread_bits + fsbase_bits) / 8)
}

/// The member `name` of a struct (looking into anonymous structs and
/// unions, where randomized or grouped fields sit): its type, typedefs and
/// qualifiers peeled, and its offset in bits from the struct's start.
fn member(btf: &Btf, parent: &Type, name: &str) -> Option<(Type, u32)> {
    let (Type::Struct(fields) | Type::Union(fields)) = parent else {
        return None;
    };
    for field in &fields.members {
        let field_name = btf.resolve_name(field).unwrap_or_default();
        if field_name == name {
            let field_type = peel(btf, btf.resolve_chained_type(field).ok()?)?;
            return Some((field_type, field.bit_offset()));
        }
        if field_name.is_empty() {
            let field_type = peel(btf, btf.resolve_chained_type(field).ok()?)?;
            if let Some((found, offset)) = member(btf, &field_type, name) {
                return Some((found, field.bit_offset() + offset));
            }
        }
    }
    None
}

fn peel(btf: &Btf, mut ty: Type) -> Option<Type> {
    for _ in 0..16 {
        match &ty {
            Type::Typedef(_) | Type::Volatile(_) | Type::Const(_) | Type::Restrict(_) => {
                let inner = ty.as_btf_type()?;
                ty = btf.resolve_chained_type(inner).ok()?;
            }
            _ => return Some(ty),
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn missing_file_is_a_clear_error() {
        let error = task_thread_pointer_offset(Path::new("/nonexistent/vmlinux"))
            .expect_err("no such file");
        assert!(error.to_string().contains("/nonexistent/vmlinux"));
    }
}
