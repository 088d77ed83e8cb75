//! [`Client`]: one simulated client's state: what it takes ([`Kind`]), what
//! it asks ([`Op`]), where it is ([`ClientState`]) and its session
//! ([`OpenSession`]). `clients.rs` drives the clients.

use fencelock_types::{FencingToken, Key, LeaseMs, Owner, Share};

#[derive(Clone, Debug)]
pub(crate) enum Op {
    Acquire {
        key: Key,
        lease_ms: LeaseMs,
        wait_ms: u64,
        /// With the owner as the lock's value, as an election candidate
        /// names itself (a level-2 request); without, once refused for it.
        value: bool,
    },
    /// A reader's or the writer's acquire of a read-write lock, or a
    /// permit's of a semaphore.
    AcquireShared {
        key: Key,
        share: Share,
        lease_ms: LeaseMs,
        wait_ms: u64,
    },
    /// A holder of a shared key asks for it in another kind (it keeps
    /// holding it under `token`, and goes back to that afterwards).
    Probe {
        key: Key,
        share: Share,
        token: FencingToken,
        lease_ms: LeaseMs,
        release_at_ms: u64,
    },
    Renew {
        key: Key,
        token: FencingToken,
        lease_ms: LeaseMs,
        /// When the holder means to let go: it renews until then.
        release_at_ms: u64,
    },
    Release {
        key: Key,
        token: FencingToken,
    },
    /// A session client opens a session.
    OpenSession {
        ttl_ms: LeaseMs,
    },
    /// A keep-alive of a session.
    KeepAlive {
        session: FencingToken,
    },
    CloseSession {
        session: FencingToken,
    },
    /// An acquire under a session: a plain lock (`share` none) or shared.
    AcquireIn {
        key: Key,
        share: Option<Share>,
        session: FencingToken,
        wait_ms: u64,
    },
    /// A renew of a lock held under a session: it renews the session.
    RenewIn {
        key: Key,
        token: FencingToken,
        session: FencingToken,
    },
    /// A release of one lock held under a session.
    ReleaseIn {
        key: Key,
        token: FencingToken,
    },
    /// A linearizable read of one key's holder.
    Get {
        key: Key,
    },
    /// A linearizable check that `token` holds `key`.
    Check {
        key: Key,
        token: FencingToken,
    },
    /// A linearizable list of the locks under a prefix.
    List {
        prefix: Vec<u8>,
    },
    /// The changes under a prefix after a position (none: the start).
    Watch {
        prefix: Vec<u8>,
        after: Option<u64>,
        wait_ms: u64,
    },
}

#[derive(Debug)]
pub(crate) enum ClientState {
    Idle,
    /// Sends `op` again when its timer fires (its connection dropped).
    Retrying {
        op: Op,
    },
    Waiting {
        seq: u64,
        op: Op,
        sent_ms: u64,
        deadline_ms: u64,
    },
    Holding {
        key: Key,
        token: FencingToken,
        lease_ms: LeaseMs,
        release_at_ms: u64,
    },
}

/// What a client takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Plain,
    /// Read-write locks and semaphores.
    Shared,
    /// Plain and shared keys, under a session.
    Session,
}

/// A session client's session, as it believes it.
#[derive(Debug)]
pub(crate) struct OpenSession {
    pub(crate) id: FencingToken,
    pub(crate) ttl_ms: LeaseMs,
    /// What it holds under it: key and token.
    pub(crate) held: Vec<(Key, FencingToken)>,
    /// What it still means to acquire under it.
    pub(crate) plan: Vec<(Key, Option<Share>)>,
    /// When it sends its next keep-alive (a third of the TTL after the
    /// last answer).
    pub(crate) keep_alive_at_ms: u64,
    /// When it ends the session, and whether by closing it (else it stops
    /// keeping it alive, and it must lapse).
    pub(crate) end_at_ms: u64,
    pub(crate) close: bool,
}

pub struct Client {
    /// Bumped whenever the client's timer is set, so that earlier timers
    /// are ignored.
    pub(crate) generation: u64,
    pub(crate) owner: Owner,
    /// The user its renewals and releases name, as an authenticated (TLS)
    /// client's do: every other client has one, so both paths run.
    pub(crate) user: Option<Owner>,
    pub(crate) target: usize,
    /// Takes read-write locks and semaphores, not plain locks.
    pub(crate) shared: bool,
    /// Holds keys under a session.
    pub(crate) sessions: bool,
    /// A session client's open session.
    pub(crate) session: Option<OpenSession>,
    /// The node and connection it talks over, if one is open.
    pub(crate) conn: Option<(usize, u64)>,
    pub(crate) state: ClientState,
    /// The key this client must get and release after the heal.
    pub(crate) final_key: Key,
    pub(crate) served_after_heal: bool,
    pub(crate) next_seq: u64,
    /// Where its watch of the keys is: the index of the last answer.
    pub(crate) watch_at: Option<u64>,
}

impl Client {
    pub(crate) fn new(index: usize, nodes: usize, kind: Kind) -> Client {
        let owner = Owner::new(format!("client-{}", index + 1).into_bytes()).expect("a valid owner");
        Client {
            generation: 0,
            user: index.is_multiple_of(2).then(|| owner.clone()),
            owner,
            target: index % nodes,
            shared: kind == Kind::Shared,
            sessions: kind == Kind::Session,
            session: None,
            conn: None,
            state: ClientState::Idle,
            final_key: Key::new(format!("final/{}", index + 1).into_bytes()).expect("a valid key"),
            served_after_heal: false,
            next_seq: 0,
            watch_at: None,
        }
    }
}
