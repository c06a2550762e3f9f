//! The process heap: the binaries' allocator, and giving free memory back
//! to the system.
//!
//! The daemon and `kpr-bench` allocate with jemalloc ([`Allocator`], one
//! allocator for every thread), configured by [`malloc_conf`]: a background
//! thread returns freed pages to the system about a second after they are
//! freed. Measured at 10,000 services from one manifest file, peak RSS /
//! RSS 60 s after the first sync: glibc's malloc (an arena per thread,
//! each keeping what its thread freed) 208 / 131 MB, glibc with two arenas
//! 208 / 116 MB, mimalloc 206 / 188 MB, jemalloc so configured 128 / 68 MB.

/// The global allocator of the daemon and `kpr-bench` (each binary declares
/// `#[global_allocator] static ALLOCATOR: Allocator = tikv_jemallocator::Jemalloc;`).
pub type Allocator = tikv_jemallocator::Jemalloc;

/// jemalloc's options, read at its start (the symbol it looks for, with
/// the crate's `_rjem_` prefix): a background thread purges freed pages,
/// dirty pages are purged after 1 s and straight back to the system
/// (no lazily freed "muzzy" stage, which the RSS would still count), and
/// no transparent huge pages where the kernel would use them everywhere
/// (`always`: in the test VM, IPVS mode at 10,000 services, peak RSS
/// 114.0 MB without them against 127.6 MB with them).
#[export_name = "_rjem_malloc_conf"]
#[used]
#[allow(non_upper_case_globals)]
pub static malloc_conf: &[u8; 70] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0,thp:never\0";

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
