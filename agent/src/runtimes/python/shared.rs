//! What lets the namer share a code object between processes: where the
//! interpreter object lies in the process, and whose the process is.

use std::{os::unix::fs::MetadataExt, path::Path};

use agent_runtimes::python::SharedObject;

use crate::process::ProcessImage;

/// The interpreter object (the image's mapping `index`, loaded `bias` above
/// its link-time addresses) as the namer shares its code objects, or
/// `None` if the object or the process's owner is not known.
pub(super) fn shared_object(
    proc_root: &Path,
    image: &ProcessImage,
    index: usize,
    bias: u64,
) -> Option<SharedObject> {
    let object = image.mappings.get(index)?.object()?;
    let ranges = object
        .layout
        .segments
        .iter()
        .filter(|segment| segment.file_size > 0)
        .filter_map(|segment| {
            // Segment fields come from the file: nothing may wrap.
            let start = segment.vaddr.wrapping_add(bias);
            let end = start.checked_add(segment.file_size)?;
            Some((start..end, segment.file_offset))
        })
        .collect();
    Some(SharedObject {
        owner: owner(proc_root, image.tgid)?,
        content: object.content_id.get(),
        ranges,
    })
}

/// Who can change the process's memory: the owner of `/proc/PID`, its
/// effective uid, or root once it is not dumpable (a set-uid program),
/// which is whom the kernel lets write its memory. One `stat` per
/// interpreter process (its status file would be one more file read and
/// parsed); what the namer reads of the process by its pid has the same
/// window for a reused pid as this does.
fn owner(proc_root: &Path, tgid: u32) -> Option<u32> {
    std::fs::metadata(proc_root.join(tgid.to_string()))
        .ok()
        .map(|metadata| metadata.uid())
}
