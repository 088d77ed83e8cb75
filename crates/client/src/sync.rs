//! [`lock`]: the client's mutexes, taken whatever a panic elsewhere left.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks a mutex whose data stays consistent across a panic (each update is a
/// single assignment or map operation).
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
