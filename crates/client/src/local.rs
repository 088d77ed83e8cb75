//! The locks this process holds through guards, by owner and key.
//!
//! The server answers an acquire by the owner that holds the key with the
//! holder's own token (`existing`): that is what makes a retried acquire
//! safe. Within one process it would also let two threads that share a
//! [`Client`](crate::Client) (one owner) both "hold" the same key, and
//! dropping one guard would release the other's lock. So a guard first
//! takes the key here: a second guard for a key its owner already holds in
//! this process waits (up to its `wait`) for the first to be dropped, or
//! fails as the server would for another owner. It never shares the lock.
//! `Client::acquire_raw`, which makes no guard, is not bound by this.
//!
//! The registry is the process's, shared by the blocking client and the
//! async one (`fencelock-client-async`): a guard of one never shares a lock
//! with a guard of the other either. It knows owners and keys, not
//! clusters: two clients of one process that talk to two clusters under one
//! owner wait for each other on a key they both take. Give them different
//! owners.

use std::collections::HashMap;
use std::sync::{Condvar, LazyLock, Mutex};
use std::time::{Duration, Instant};

use crate::sync::lock;
use crate::ClientError;

/// An owner and a key.
type Id = (Vec<u8>, Vec<u8>);

/// Per (owner, key): the token of the guard that holds it (0 while its
/// acquire is under way).
#[derive(Default)]
struct Holds {
    held: Mutex<HashMap<Id, u64>>,
    freed: Condvar,
}

static HOLDS: LazyLock<Holds> = LazyLock::new(Holds::default);

/// A key this process holds (or is acquiring) for an owner; let go when
/// dropped.
#[derive(Debug)]
pub struct LocalHold {
    owner: Vec<u8>,
    key: Vec<u8>,
}

impl LocalHold {
    /// Takes `key` for `owner` in this process, waiting up to `wait` for
    /// another guard of the same owner to let it go.
    pub fn take(owner: &[u8], key: &[u8], wait: Duration) -> Result<LocalHold, ClientError> {
        let deadline = Instant::now() + wait;
        let id = (owner.to_vec(), key.to_vec());
        let mut held = lock(&HOLDS.held);
        loop {
            let Some(token) = held.get(&id).copied() else {
                held.insert(id, 0);
                return Ok(LocalHold { owner: owner.to_vec(), key: key.to_vec() });
            };
            let now = Instant::now();
            if now >= deadline {
                let holder_token = Some(token).filter(|token| *token != 0);
                return Err(if wait.is_zero() {
                    ClientError::Held { holder_token }
                } else {
                    ClientError::WaitTimedOut { holder_token }
                });
            }
            held = HOLDS
                .freed
                .wait_timeout(held, deadline - now)
                .map_or_else(|err| err.into_inner().0, |(held, _)| held);
        }
    }

    /// Takes `key` for `owner` if no guard of this process holds it;
    /// otherwise says which token holds it (`None`: its acquire is under
    /// way). For callers that must not block a thread (the async client
    /// polls this while it waits).
    pub fn try_take(owner: &[u8], key: &[u8]) -> Result<LocalHold, Option<u64>> {
        let id = (owner.to_vec(), key.to_vec());
        let mut held = lock(&HOLDS.held);
        match held.get(&id) {
            Some(token) => Err(Some(*token).filter(|token| *token != 0)),
            None => {
                held.insert(id, 0);
                Ok(LocalHold { owner: owner.to_vec(), key: key.to_vec() })
            }
        }
    }

    /// The token the server granted: what a second guard's error names.
    pub fn granted(&self, token: u64) {
        if let Some(slot) = lock(&HOLDS.held).get_mut(&(self.owner.clone(), self.key.clone())) {
            *slot = token;
        }
    }
}

impl Drop for LocalHold {
    fn drop(&mut self) {
        lock(&HOLDS.held).remove(&(std::mem::take(&mut self.owner), std::mem::take(&mut self.key)));
        HOLDS.freed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_second_hold_of_one_owner_waits_for_the_first_or_fails() {
        let first = LocalHold::take(b"local-test-owner", b"k", Duration::ZERO).unwrap();
        first.granted(41);
        assert!(matches!(
            LocalHold::take(b"local-test-owner", b"k", Duration::ZERO),
            Err(ClientError::Held { holder_token: Some(41) })
        ));
        assert!(matches!(
            LocalHold::take(b"local-test-owner", b"k", Duration::from_millis(50)),
            Err(ClientError::WaitTimedOut { holder_token: Some(41) })
        ));
        assert!(matches!(LocalHold::try_take(b"local-test-owner", b"k"), Err(Some(41))));
        // Another owner, or another key, is not held back.
        drop(LocalHold::take(b"local-test-other", b"k", Duration::ZERO).unwrap());
        drop(LocalHold::take(b"local-test-owner", b"k2", Duration::ZERO).unwrap());
        // A waiter gets the key once the first lets it go.
        let taken = Arc::new(Mutex::new(false));
        let flag = Arc::clone(&taken);
        let waiter = std::thread::spawn(move || {
            let hold = LocalHold::take(b"local-test-owner", b"k", Duration::from_secs(30));
            *lock(&flag) = true;
            hold.map(drop)
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!*lock(&taken), "the waiter took a key that was held");
        drop(first);
        assert!(waiter.join().unwrap().is_ok());
        assert!(*lock(&taken));
    }
}
