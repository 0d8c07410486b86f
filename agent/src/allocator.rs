//! How glibc's allocator is told to give memory back.
//!
//! firn allocates in bursts (a symbol table or DWARF index built, a
//! profile encoded) and then holds little. By default glibc keeps one
//! arena per thread that ever allocated (up to 8 per CPU) and raises its
//! mmap threshold after every large free, so later large buffers come from
//! the arenas and stay there, fragmented: measured, that is tens of MB of
//! anonymous RSS that only grows with uptime.

/// Large allocations above this are mmapped, so freeing them returns them
/// to the system at once. Fixing the value also turns off glibc's raising
/// of it.
const MMAP_THRESHOLD: i32 = 128 << 10;

/// Arenas shared by all threads: firn's threads rarely allocate at once,
/// so contention costs little while every extra arena keeps its own free
/// memory.
const ARENAS: i32 = 2;

/// Sets the allocator up; call first thing in `main`, before any thread
/// starts.
pub fn tune() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before
    // other threads exist.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENAS);
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

/// Returns the free memory at the top of and inside the arenas to the
/// system: after a burst of frees (a profile built, a cache entry
/// evicted) it would otherwise stay in firn's RSS.
pub fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim has no preconditions; it only returns free memory.
    unsafe {
        libc::malloc_trim(0);
    }
}
