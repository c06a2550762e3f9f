//! The process heap: the binaries' allocator, and giving free memory back
//! to the system.
//!
//! The daemon and `kpr-bench` allocate with jemalloc ([`Allocator`], one
//! allocator for every thread), configured by [`malloc_conf`]: a background
//! thread returns freed pages to the system about a second after they are
//! freed. At 10,000 services from one manifest file the daemon's peak RSS
//! was 208 MB with glibc's malloc (its per-thread arenas each keep what the
//! thread freed), 208 MB with glibc limited to two arenas, 206 MB with
//! mimalloc, and 128 MB with jemalloc configured so; the RSS 60 s after the
//! first sync 131, 116, 188 and 68 MB.

/// The global allocator of the daemon and `kpr-bench` (each binary declares
/// `#[global_allocator] static ALLOCATOR: Allocator = tikv_jemallocator::Jemalloc;`).
pub type Allocator = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its start (the symbol it looks for, with
/// the crate's `_rjem_` prefix): a background thread purges freed pages,
/// dirty pages are purged after 1 s and straight back to the system
/// (no lazily freed "muzzy" stage, which the RSS would still count).
#[export_name = "_rjem_malloc_conf"]
#[used]
#[allow(non_upper_case_globals)]
pub static malloc_conf: &[u8; 60] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

/// `mallctl` name purging every arena (`MALLCTL_ARENAS_ALL` is 4096).
const PURGE_ALL_ARENAS: &[u8] = b"arena.4096.purge\0";

/// Gives the heap's free memory back to the system now, rather than when
/// the background thread would: jemalloc's arenas are purged, and glibc's
/// `malloc_trim` runs for what is still allocated with glibc (C code, and
/// processes without [`Allocator`], such as the tests). Milliseconds on a
/// large heap: call it off the actors' thread ([`trim_in_background`]).
pub fn trim() {
    // SAFETY: the name is a NUL-terminated mallctl name; purging takes no
    // old or new value (null pointers, length 0).
    unsafe {
        tikv_jemalloc_sys::mallctl(
            PURGE_ALL_ARENAS.as_ptr().cast(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        );
    }
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers; it only walks malloc's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// [`trim`] on tokio's blocking pool (the caller does not wait).
pub fn trim_in_background() {
    drop(tokio::task::spawn_blocking(trim));
}
