//! [`Pool`]: the open connection per node address, shared by every call.
//! The shells open connections (outside the pool's lock, so that one slow
//! node holds up no call to the others); the pool decides which one a call
//! uses, and forgets a connection once it failed.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// A connection the pool can tell closed.
pub trait Pooled {
    /// True once the connection failed for good.
    fn is_closed(&self) -> bool;
}

/// The open connection per address.
#[derive(Debug)]
pub struct Pool<C> {
    open: Mutex<HashMap<String, Arc<C>>>,
}

impl<C> Default for Pool<C> {
    fn default() -> Pool<C> {
        Pool { open: Mutex::new(HashMap::new()) }
    }
}

impl<C: Pooled> Pool<C> {
    fn open(&self) -> MutexGuard<'_, HashMap<String, Arc<C>>> {
        // Each update is one map operation.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The open connection to `addr`, if there is one.
    pub fn get(&self, addr: &str) -> Option<Arc<C>> {
        self.open().get(addr).filter(|connection| !connection.is_closed()).cloned()
    }

    /// Keeps `fresh`, just opened to `addr`, unless another caller opened
    /// one meanwhile: then that one is shared and `fresh` dropped.
    pub fn share(&self, addr: &str, fresh: Arc<C>) -> Arc<C> {
        let mut open = self.open();
        match open.get(addr) {
            Some(existing) if !existing.is_closed() => Arc::clone(existing),
            _ => {
                open.insert(addr.to_owned(), Arc::clone(&fresh));
                fresh
            }
        }
    }

    /// Forgets `connection` (it failed), unless `addr` has another by now.
    pub fn forget(&self, addr: &str, connection: &Arc<C>) {
        let mut open = self.open();
        if open.get(addr).is_some_and(|current| Arc::ptr_eq(current, connection)) {
            open.remove(addr);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[derive(Default)]
    struct Fake(AtomicBool);

    impl Pooled for Fake {
        fn is_closed(&self) -> bool {
            self.0.load(Ordering::SeqCst)
        }
    }

    #[test]
    fn a_connection_is_shared_until_it_closes_and_a_failed_one_is_forgotten_once() {
        let pool: Pool<Fake> = Pool::default();
        assert!(pool.get("a:1").is_none());
        let first = pool.share("a:1", Arc::default());
        // A second caller that connected meanwhile gets the first's.
        let raced = pool.share("a:1", Arc::default());
        assert!(Arc::ptr_eq(&first, &raced));
        assert!(Arc::ptr_eq(&pool.get("a:1").unwrap(), &first));
        first.0.store(true, Ordering::SeqCst);
        assert!(pool.get("a:1").is_none());
        let second = pool.share("a:1", Arc::default());
        assert!(!Arc::ptr_eq(&first, &second));
        // A late failure report of the old one leaves the new one alone.
        pool.forget("a:1", &first);
        assert!(Arc::ptr_eq(&pool.get("a:1").unwrap(), &second));
        pool.forget("a:1", &second);
        assert!(pool.get("a:1").is_none());
    }
}
