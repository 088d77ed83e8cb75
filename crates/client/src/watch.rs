//! Watches and election observers on the blocking client
//! ([`Client::watch`], [`Client::watch_from`], [`Client::observe`]).
//!
//! A [`Watch`] follows the changes of holders of the keys under a prefix,
//! in log order, by asking any node for the changes after the last index it
//! was told (a long poll, `WatchRequest`). It resumes where it was after a
//! reconnect or on another node; a position a node no longer holds comes
//! back `compacted`, with the current holders. An [`Observer`] follows one
//! election (one key) on a watch, and tells each new leader and value.

use std::time::Duration;

use crate::client::Client;
use crate::sansio::calls;
use crate::sansio::observe::{LeaderChange, ObserverState};
use crate::types::WatchBatch;
use crate::ClientError;

/// Follows the holders of the keys under a prefix. See the module docs.
#[derive(Debug)]
pub struct Watch {
    client: Client,
    prefix: Vec<u8>,
    /// The index up to which every change has been told; `None` before the
    /// first answer (which brings the current holders).
    position: Option<u64>,
    limit: u32,
}

impl Client {
    /// Follows the holders of the keys under `prefix` from now on: the
    /// first [`Watch::next`] brings the current holders, the next ones the
    /// changes, in log order.
    pub fn watch(&self, prefix: impl AsRef<[u8]>) -> Watch {
        Watch::new(self.clone(), prefix.as_ref().to_vec(), None)
    }

    /// Follows the holders of the keys under `prefix` from log index
    /// `position` on (a [`Watch::position`] seen before): the changes after
    /// it, or, if a node no longer holds them, a compacted answer with the
    /// current holders.
    pub fn watch_from(&self, prefix: impl AsRef<[u8]>, position: u64) -> Watch {
        Watch::new(self.clone(), prefix.as_ref().to_vec(), Some(position))
    }

    /// Follows `election`: who leads now, then each new leader and value
    /// ([`Observer::next`]).
    pub fn observe(&self, election: impl AsRef<[u8]>) -> Observer {
        let key = election.as_ref().to_vec();
        Observer::new(Watch::new(self.clone(), key.clone(), None), key)
    }
}

impl Watch {
    pub(crate) fn new(client: Client, prefix: Vec<u8>, position: Option<u64>) -> Watch {
        Watch { client, prefix, position, limit: 0 }
    }

    /// The index up to which every change has been told (a position to
    /// resume from with [`Client::watch_from`]); `None` before the first
    /// answer.
    pub fn position(&self) -> Option<u64> {
        self.position
    }

    /// Waits up to `wait` (at most 60 s) for changes, and returns them;
    /// the first call, and the first after a compacted position, also
    /// brings the current holders (`current`). An empty batch: nothing
    /// changed within `wait`. Retries across nodes like every call.
    pub fn next(&mut self, wait: Duration) -> Result<WatchBatch, ClientError> {
        let after = self.position;
        // The first answer (no position) comes at once, with the holders.
        let wait = if after.is_none() { Duration::ZERO } else { wait };
        let inner = &self.client.inner;
        let request = calls::watch(&self.prefix, after, wait, self.limit);
        let timeout = wait + inner.request_timeout;
        let (kind, _) = inner.call(|| (request.clone(), timeout), inner.retry_for + wait)?;
        let batch = calls::watch_answer(kind, after)?;
        self.position = Some(batch.index);
        Ok(batch)
    }
}

/// Follows one election: each new leader, and each new value it
/// proclaims, in log order (the fold is the sans-IO [`ObserverState`]).
#[derive(Debug)]
pub struct Observer {
    watch: Watch,
    state: ObserverState,
}

impl Observer {
    pub(crate) fn new(watch: Watch, key: Vec<u8>) -> Observer {
        Observer { watch, state: ObserverState::new(key) }
    }

    /// Waits up to `wait` for the leader to change, and says how: the first
    /// call says who leads now. `None`: nothing changed within `wait`.
    pub fn next(&mut self, wait: Duration) -> Result<Option<LeaderChange>, ClientError> {
        let deadline = std::time::Instant::now() + wait;
        loop {
            if let Some(change) = self.state.pop() {
                return Ok(Some(change));
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() && self.state.has_told() {
                return Ok(None);
            }
            let batch = self.watch.next(left)?;
            self.state.take(batch);
        }
    }
}
