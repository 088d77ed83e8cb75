//! The requests a node has taken from clients and not answered yet, by the
//! connection they came on: what a closed connection leaves behind.
//!
//! It owns no raft state. The [`Node`](crate::Node) asks it where an answer
//! goes, and learns from it which requests lost their asker: those not yet
//! proposed are cancelled, and those in flight become orphans, whose grants
//! are released as ghosts when they apply.

use std::collections::{BTreeMap, BTreeSet};

use crate::types::RequestId;

/// A client connection, as the shell numbers them. Requests that come on no
/// connection of their own (a channel, a test) may share
/// [`ConnId::NONE`], which is never closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u64);

impl ConnId {
    pub const NONE: ConnId = ConnId(0);
}

/// Where each open request's answer goes.
#[derive(Debug)]
pub struct Registry<T> {
    next_id: u64,
    open: BTreeMap<RequestId, Asker<T>>,
    by_conn: BTreeMap<ConnId, BTreeSet<RequestId>>,
}

#[derive(Debug)]
struct Asker<T> {
    conn: ConnId,
    /// `None` once its connection closed: an orphan.
    reply_to: Option<T>,
}

/// Who asked a request that has been answered.
#[derive(Debug, PartialEq, Eq)]
pub enum Answered<T> {
    /// The asker waits: hand it the answer.
    To(T),
    /// Its connection closed: whatever the request was granted is a ghost.
    Orphan,
}

impl<T> Default for Registry<T> {
    fn default() -> Registry<T> {
        Registry { next_id: 0, open: BTreeMap::new(), by_conn: BTreeMap::new() }
    }
}

impl<T> Registry<T> {
    /// Numbers a new request from `conn` (ids count up from 1, below the
    /// replica's internal ones).
    pub fn register(&mut self, conn: ConnId, reply_to: T) -> RequestId {
        self.next_id += 1;
        let id = RequestId(self.next_id);
        self.open.insert(id, Asker { conn, reply_to: Some(reply_to) });
        if conn != ConnId::NONE {
            self.by_conn.entry(conn).or_default().insert(id);
        }
        id
    }

    /// The asker of `id`, once: `None` if `id` is not an open request.
    pub fn answer(&mut self, id: RequestId) -> Option<Answered<T>> {
        let asker = self.open.remove(&id)?;
        self.forget_conn(asker.conn, id);
        Some(match asker.reply_to {
            Some(reply_to) => Answered::To(reply_to),
            None => Answered::Orphan,
        })
    }

    /// `conn` closed: its open requests become orphans. Returns them, for
    /// the replica to cancel those it has not proposed yet
    /// ([`Registry::forget`] each one it did cancel).
    pub fn close(&mut self, conn: ConnId) -> Vec<RequestId> {
        if conn == ConnId::NONE {
            return Vec::new();
        }
        let ids: Vec<RequestId> = self.by_conn.remove(&conn).into_iter().flatten().collect();
        for id in &ids {
            if let Some(asker) = self.open.get_mut(id) {
                asker.reply_to = None;
            }
        }
        ids
    }

    /// Drops `id` without an answer (the replica cancelled it).
    pub fn forget(&mut self, id: RequestId) {
        if let Some(asker) = self.open.remove(&id) {
            self.forget_conn(asker.conn, id);
        }
    }

    /// Every open request's asker, orphans left out: for a node that stops.
    pub fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.by_conn.clear();
        std::mem::take(&mut self.open).into_values().filter_map(|asker| asker.reply_to)
    }

    pub fn len(&self) -> usize {
        self.open.len()
    }

    pub fn is_empty(&self) -> bool {
        self.open.is_empty()
    }

    fn forget_conn(&mut self, conn: ConnId, id: RequestId) {
        // A connection's set stays while it is open, empty or not, so that
        // one request at a time does not build and drop a set each time;
        // `close` takes it.
        if let Some(ids) = self.by_conn.get_mut(&conn) {
            ids.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_goes_to_its_asker_once() {
        let mut registry = Registry::default();
        let a = registry.register(ConnId(1), "a");
        let b = registry.register(ConnId(1), "b");
        assert_ne!(a, b);
        assert_eq!(registry.answer(b), Some(Answered::To("b")));
        assert_eq!(registry.answer(b), None);
        assert_eq!(registry.len(), 1);
    }

    #[test]
    fn a_closed_connection_orphans_only_its_own_requests() {
        let mut registry = Registry::default();
        let a = registry.register(ConnId(1), "a");
        let b = registry.register(ConnId(2), "b");
        let none = registry.register(ConnId::NONE, "none");
        assert_eq!(registry.close(ConnId(1)), vec![a]);
        assert_eq!(registry.close(ConnId::NONE), Vec::new());
        assert_eq!(registry.answer(a), Some(Answered::Orphan));
        assert_eq!(registry.answer(b), Some(Answered::To("b")));
        assert_eq!(registry.answer(none), Some(Answered::To("none")));
        assert!(registry.is_empty());
    }

    #[test]
    fn closing_twice_or_after_the_answer_changes_nothing() {
        let mut registry = Registry::default();
        let a = registry.register(ConnId(3), "a");
        assert_eq!(registry.answer(a), Some(Answered::To("a")));
        assert!(registry.close(ConnId(3)).is_empty());
        let b = registry.register(ConnId(3), "b");
        assert_eq!(registry.close(ConnId(3)), vec![b]);
        assert!(registry.close(ConnId(3)).is_empty());
        registry.forget(b);
        assert!(registry.is_empty());
    }

    #[test]
    fn a_million_requests_on_closed_connections_leave_nothing_behind() {
        let mut registry = Registry::default();
        for conn in 1..=1_000u64 {
            for n in 0..1_000u64 {
                registry.register(ConnId(conn), n);
            }
            for id in registry.close(ConnId(conn)) {
                registry.forget(id);
            }
        }
        assert!(registry.is_empty());
        assert!(registry.by_conn.is_empty());
    }
}
