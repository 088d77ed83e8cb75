//! The fenced store: the resource the locks protect, as a real one would
//! guard itself with fencing tokens.
//!
//! Per key it remembers the highest token it has accepted and turns away a
//! write carrying a lower one. It keeps its own log of every write, in the
//! order it decided them, which the checker reads after the run.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use serde::Serialize;

/// One write the store decided, in its order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct StoreWrite {
    pub key: String,
    pub token: u64,
    pub client: usize,
    /// When the store decided it (microseconds since the run started).
    pub at_us: u64,
    pub accepted: bool,
    /// The highest token accepted on the key before this write.
    pub highest_before: Option<u64>,
}

#[derive(Debug, Default)]
struct Inner {
    highest: BTreeMap<String, u64>,
    log: Vec<StoreWrite>,
}

/// A key-value resource that checks fencing tokens.
#[derive(Debug, Default)]
pub struct FencedStore {
    inner: Mutex<Inner>,
}

impl FencedStore {
    /// Writes to `key` with `token`: `Ok` if accepted, `Err(highest)` if a
    /// higher token was accepted before. An equal token is accepted: it is
    /// the same holder writing again.
    pub fn write(&self, key: &str, token: u64, client: usize, at_us: u64) -> Result<(), u64> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let highest_before = inner.highest.get(key).copied();
        let accepted = highest_before.is_none_or(|highest| token >= highest);
        if accepted {
            inner.highest.insert(key.to_owned(), token);
        }
        inner.log.push(StoreWrite { key: key.to_owned(), token, client, at_us, accepted, highest_before });
        match highest_before {
            Some(highest) if !accepted => Err(highest),
            _ => Ok(()),
        }
    }

    /// Every write so far, in the order the store decided them.
    pub fn log(&self) -> Vec<StoreWrite> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner).log.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lower_token_is_turned_away_and_an_equal_one_accepted() {
        let store = FencedStore::default();
        assert_eq!(store.write("a", 5, 0, 1), Ok(()));
        assert_eq!(store.write("a", 5, 0, 2), Ok(()));
        assert_eq!(store.write("a", 4, 1, 3), Err(5));
        assert_eq!(store.write("b", 1, 1, 4), Ok(()), "keys are fenced separately");
        assert_eq!(store.write("a", 9, 2, 5), Ok(()));
        let log = store.log();
        assert_eq!(log.len(), 5);
        assert!(!log[2].accepted);
        assert_eq!(log[2].highest_before, Some(5));
    }
}
