//! The process heap: giving malloc's free memory back to the system.

/// Gives the heap's free memory back to the system (glibc's `malloc_trim`,
/// every arena); elsewhere nothing. It walks malloc's free lists and
/// releases pages, milliseconds on a large heap: call it off the actors'
/// thread ([`trim_in_background`]).
pub fn trim() {
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
