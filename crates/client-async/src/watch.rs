//! Watches and election observers on the async client
//! ([`AsyncClient::watch`], [`AsyncClient::watch_from`],
//! [`AsyncClient::observe`]).
//!
//! An [`AsyncWatch`] follows the changes of holders of the keys under a
//! prefix, in log order, by asking any node for the changes after the last
//! index it was told (a long poll, `WatchRequest`). It resumes where it was
//! after a reconnect or on another node; a position a node no longer holds
//! comes back `compacted`, with the current holders. An [`AsyncObserver`]
//! follows one election (one key) on a watch, and tells each new leader and
//! value; the fold is the sans-IO [`ObserverState`], which the blocking
//! [`fencelock_client::Observer`] runs too.
//!
//! Both are cancel-safe: a `next` dropped before it resolves loses nothing,
//! since the position moves (and the observer folds an answer) only once an
//! answer has come.

use std::time::{Duration, Instant};

use fencelock_client::sansio::ObserverState;
use fencelock_client::{ClientError, LeaderChange, WatchBatch};

use crate::client::AsyncClient;

/// Follows the holders of the keys under a prefix. See the module docs.
#[derive(Debug)]
pub struct AsyncWatch {
    client: AsyncClient,
    prefix: Vec<u8>,
    /// The index up to which every change has been told; `None` before the
    /// first answer (which brings the current holders).
    position: Option<u64>,
}

impl AsyncClient {
    /// Follows the holders of the keys under `prefix` from now on: the
    /// first [`AsyncWatch::next`] brings the current holders, the next ones
    /// the changes, in log order.
    pub fn watch(&self, prefix: impl AsRef<[u8]>) -> AsyncWatch {
        AsyncWatch::new(self.clone(), prefix.as_ref().to_vec(), None)
    }

    /// Follows the holders of the keys under `prefix` from log index
    /// `position` on (an [`AsyncWatch::position`] seen before): the changes
    /// after it, or, if a node no longer holds them, a compacted answer
    /// with the current holders.
    pub fn watch_from(&self, prefix: impl AsRef<[u8]>, position: u64) -> AsyncWatch {
        AsyncWatch::new(self.clone(), prefix.as_ref().to_vec(), Some(position))
    }

    /// Follows `election`: who leads now, then each new leader and value
    /// ([`AsyncObserver::next`]).
    pub fn observe(&self, election: impl AsRef<[u8]>) -> AsyncObserver {
        let key = election.as_ref().to_vec();
        AsyncObserver::new(AsyncWatch::new(self.clone(), key.clone(), None), key)
    }
}

impl AsyncWatch {
    pub(crate) fn new(client: AsyncClient, prefix: Vec<u8>, position: Option<u64>) -> AsyncWatch {
        AsyncWatch { client, prefix, position }
    }

    /// The index up to which every change has been told (a position to
    /// resume from with [`AsyncClient::watch_from`]); `None` before the
    /// first answer.
    pub fn position(&self) -> Option<u64> {
        self.position
    }

    /// Waits up to `wait` (at most 60 s) for changes, and returns them;
    /// the first call, and the first after a compacted position, also
    /// brings the current holders (`current`). An empty batch: nothing
    /// changed within `wait`. Retries across nodes like every call.
    pub async fn next(&mut self, wait: Duration) -> Result<WatchBatch, ClientError> {
        let after = self.position;
        // The first answer (no position) comes at once, with the holders.
        let wait = if after.is_none() { Duration::ZERO } else { wait };
        let batch = self.client.inner.watch(&self.prefix, after, wait).await?;
        self.position = Some(batch.index);
        Ok(batch)
    }
}

/// Follows one election: each new leader, and each new value it
/// proclaims, in log order (the fold is the sans-IO [`ObserverState`]).
#[derive(Debug)]
pub struct AsyncObserver {
    watch: AsyncWatch,
    state: ObserverState,
}

impl AsyncObserver {
    pub(crate) fn new(watch: AsyncWatch, key: Vec<u8>) -> AsyncObserver {
        AsyncObserver { watch, state: ObserverState::new(key) }
    }

    /// Waits up to `wait` for the leader to change, and says how: the first
    /// call says who leads now. `None`: nothing changed within `wait`.
    pub async fn next(&mut self, wait: Duration) -> Result<Option<LeaderChange>, ClientError> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(change) = self.state.pop() {
                return Ok(Some(change));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() && self.state.has_told() {
                return Ok(None);
            }
            let batch = self.watch.next(left).await?;
            self.state.take(batch);
        }
    }
}
