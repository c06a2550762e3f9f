//! An allocator that counts the bytes allocated now and at most, for test
//! binaries that measure what a piece of the daemon holds: each installs
//! it as its `#[global_allocator]` and runs one test, so the counts are that
//! test's (every allocation of the process) and do not depend on the
//! machine's load.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// The system's allocator, counting.
pub struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

/// Bytes allocated now.
pub fn now() -> usize {
    NOW.load(Ordering::Relaxed)
}

/// The most bytes allocated at once since the last [`mark`].
pub fn peak() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Starts the peak again from what is allocated now, and returns that: the
/// base a phase's [`peak`] and [`now`] are measured from.
pub fn mark() -> usize {
    let now = now();
    PEAK.store(now, Ordering::Relaxed);
    now
}

fn grew(by: usize) {
    let now = NOW.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call is passed to the system's allocator as it came.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = System.alloc(layout);
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout);
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = System.realloc(ptr, layout, new_size);
        if !p.is_null() {
            NOW.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}
