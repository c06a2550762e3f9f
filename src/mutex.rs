//! Locking that survives a panic elsewhere: a poisoned mutex still holds
//! valid data for our uses (counters, caches, in-memory kernels), and the
//! daemon must not stop over it.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the data even if another thread panicked holding it.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
