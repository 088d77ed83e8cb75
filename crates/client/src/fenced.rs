//! [`FencedRegister`]: the fencing check a resource makes, for resources
//! that live in a process (a service that takes writes from lock holders).
//!
//! It owns one thing: per resource name, the highest fencing token it has
//! admitted. It admits a token at least that high (an equal one is the same
//! holder writing again) and refuses a lower one with [`StaleToken`]. It
//! does not talk to the cluster, does not know leases, and does not hold the
//! resource's data: the caller must admit and write in one critical section
//! (see [`FencedRegister::admit`]). It forgets nothing, so it grows by one
//! entry per resource name ever admitted: forgetting a name would let a
//! stale holder of that name in again. docs/fencing.md shows it, and the
//! same check in SQL and on files, with tested examples.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// A write was refused: a higher token was admitted for the resource before.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "stale fencing token {offered} for {}: token {highest} was admitted before",
    String::from_utf8_lossy(.resource)
)]
pub struct StaleToken {
    /// The resource the write was for.
    pub resource: Vec<u8>,
    /// The token the write carried.
    pub offered: u64,
    /// The highest token admitted for the resource, higher than `offered`.
    pub highest: u64,
}

/// The highest fencing token admitted per resource; thread-safe (share it
/// by reference or in an `Arc`).
///
/// ```
/// use fencelock_client::FencedRegister;
///
/// let register = FencedRegister::new();
/// register.admit("jobs/nightly", 7)?; // the holder
/// register.admit("jobs/nightly", 7)?; // the holder again
/// let refused = register.admit("jobs/nightly", 5).unwrap_err(); // a stale holder
/// assert_eq!((refused.offered, refused.highest), (5, 7));
/// assert_eq!(register.highest("jobs/nightly"), Some(7));
/// # Ok::<(), fencelock_client::StaleToken>(())
/// ```
#[derive(Debug, Default)]
pub struct FencedRegister {
    highest: Mutex<HashMap<Vec<u8>, u64>>,
}

impl FencedRegister {
    /// An empty register: every resource admits any first token.
    pub fn new() -> FencedRegister {
        FencedRegister::default()
    }

    /// Admits a write to `resource` carrying `token` if no higher token was
    /// admitted for it before, and records `token` as the highest; refuses
    /// it otherwise. Resources are independent of one another.
    ///
    /// The check is only as good as its place: call it and make the write
    /// while holding the lock that guards the resource's state. Admitting
    /// first and writing later, outside that lock, lets a holder with a
    /// higher token admit and write in between, and the stale write then
    /// lands on top of it.
    pub fn admit(&self, resource: impl AsRef<[u8]>, token: u64) -> Result<(), StaleToken> {
        let resource = resource.as_ref();
        let mut highest = self.highest.lock().unwrap_or_else(PoisonError::into_inner);
        match highest.get_mut(resource) {
            Some(seen) if token < *seen => {
                Err(StaleToken { resource: resource.to_vec(), offered: token, highest: *seen })
            }
            Some(seen) => {
                *seen = token;
                Ok(())
            }
            None => {
                highest.insert(resource.to_vec(), token);
                Ok(())
            }
        }
    }

    /// The highest token admitted for `resource`, if any.
    pub fn highest(&self, resource: impl AsRef<[u8]>) -> Option<u64> {
        self.highest.lock().unwrap_or_else(PoisonError::into_inner).get(resource.as_ref()).copied()
    }
}

/// docs/fencing.md, whose Rust examples run as doctests of this crate.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/fencing.md")]
pub struct FencingDoc;

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn an_equal_token_is_admitted_and_a_lower_one_refused() {
        let register = FencedRegister::new();
        assert_eq!(register.highest("jobs/a"), None);
        assert_eq!(register.admit("jobs/a", 7), Ok(()));
        assert_eq!(register.admit("jobs/a", 7), Ok(()), "the same holder writes again");
        let refused = register.admit("jobs/a", 5).unwrap_err();
        assert_eq!(refused, StaleToken { resource: b"jobs/a".to_vec(), offered: 5, highest: 7 });
        assert_eq!(refused.to_string(), "stale fencing token 5 for jobs/a: token 7 was admitted before");
        assert_eq!(register.highest("jobs/a"), Some(7), "a refusal changes nothing");
        assert_eq!(register.admit("jobs/a", 9), Ok(()));
        assert_eq!(register.highest("jobs/a"), Some(9));
    }

    #[test]
    fn resources_are_fenced_separately() {
        let register = FencedRegister::new();
        register.admit("jobs/a", 9).unwrap();
        assert_eq!(register.admit("jobs/b", 3), Ok(()), "9 on jobs/a says nothing about jobs/b");
        assert_eq!(register.highest("jobs/a"), Some(9));
        assert_eq!(register.highest("jobs/b"), Some(3));
    }

    #[test]
    fn a_name_is_its_bytes_whatever_type_carries_it() {
        let register = FencedRegister::new();
        register.admit(String::from("jobs/a"), 4).unwrap();
        assert_eq!(register.highest(b"jobs/a"), Some(4));
        assert!(register.admit(&b"jobs/a"[..], 3).is_err());
        // A name that is not UTF-8 still gets an error message.
        register.admit([0xff_u8], 2).unwrap();
        assert_eq!(
            register.admit([0xff_u8], 1).unwrap_err().to_string(),
            "stale fencing token 1 for \u{fffd}: token 2 was admitted before"
        );
    }

    /// Threads race to offer the tokens 1..=500 on one resource. Whatever
    /// the interleaving, the register ends at the highest, and a token is
    /// admitted only if it is at least every token admitted before it, in
    /// the register's own order (recorded under a lock taken around each
    /// admit, as a resource would).
    #[test]
    fn racing_threads_never_move_a_resource_backwards() {
        let register = Arc::new(FencedRegister::new());
        let admitted = Arc::new(Mutex::new(Vec::new()));
        let threads: Vec<_> = (0..4_u64)
            .map(|thread| {
                let register = Arc::clone(&register);
                let admitted = Arc::clone(&admitted);
                std::thread::spawn(move || {
                    for i in 0..500_u64 {
                        // Each thread walks the tokens in its own order.
                        let token = (i * (2 * thread + 1) + thread * 37) % 500 + 1;
                        let mut admitted = admitted.lock().unwrap();
                        if register.admit("shared", token).is_ok() {
                            admitted.push(token);
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let admitted = admitted.lock().unwrap();
        assert!(admitted.windows(2).all(|pair| pair[0] <= pair[1]), "{admitted:?}");
        assert_eq!(register.highest("shared"), Some(500));
        assert_eq!(admitted.last(), Some(&500));
    }

    proptest! {
        /// For any sequence of offers: per resource, the admitted tokens
        /// never go backwards, every refusal was of a token lower than one
        /// admitted before (and names it as the highest), and `highest` is
        /// the greatest admitted.
        #[test]
        fn admitted_tokens_never_go_backwards(
            offers in prop::collection::vec((0_u8..4, 0_u64..20), 0..200)
        ) {
            let register = FencedRegister::new();
            let mut admitted: BTreeMap<String, Vec<u64>> = BTreeMap::new();
            for (resource, token) in offers {
                let resource = format!("r{resource}");
                let before = admitted.get(&resource).and_then(|tokens| tokens.iter().max().copied());
                match register.admit(&resource, token) {
                    Ok(()) => {
                        if let Some(before) = before {
                            prop_assert!(token >= before, "{resource}: {token} admitted after {before}");
                        }
                        admitted.entry(resource.clone()).or_default().push(token);
                    }
                    Err(refused) => {
                        let Some(before) = before else {
                            return Err(TestCaseError::fail(format!("{resource}: first token {token} refused")));
                        };
                        prop_assert!(token < before, "{resource}: {token} refused, but {before} was the highest");
                        prop_assert_eq!(refused.resource, resource.as_bytes().to_vec());
                        prop_assert_eq!(refused.offered, token);
                        prop_assert_eq!(refused.highest, before);
                    }
                }
                let highest = admitted.get(&resource).and_then(|tokens| tokens.last().copied());
                prop_assert_eq!(register.highest(&resource), highest);
            }
            for (resource, tokens) in &admitted {
                prop_assert!(tokens.windows(2).all(|pair| pair[0] <= pair[1]), "{resource}: {tokens:?}");
            }
        }
    }
}
