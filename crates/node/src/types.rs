//! The driver's vocabulary, shared by its modules and its users: node and
//! request ids, the settings, requests and their answers, what applied,
//! role changes, and the errors that stop a node.

use fencelock_fsm::{Lock, LockTable};
use fencelock_types::{ApplyResult, ClusterId, FencingToken, Key, LeaseMs, Owner, Value};

use crate::log::StorageError;

/// A node of the cluster, as raft-rs numbers it (never 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId(pub u64);

/// A request's id on the node that received it. The shell assigns them; the
/// driver carries them in the log to route results back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

/// The driver's settings. Times are in ticks; the server converts
/// milliseconds to ticks once, in its config.
#[derive(Clone, Debug)]
pub struct Config {
    pub id: NodeId,
    /// Every voter of the cluster, this node included.
    pub voters: Vec<NodeId>,
    pub raft: RaftSettings,
    pub leases: LeaseSettings,
    pub limits: Limits,
    pub founding: Founding,
}

/// raft-rs's timing and log settings. Part of [`Config`].
#[derive(Clone, Debug)]
pub struct RaftSettings {
    /// Ticks without a leader before a follower campaigns (the lower bound).
    pub election_ticks: usize,
    /// The upper bound (exclusive) of the randomized election timeout;
    /// `None` is raft-rs's default of twice `election_ticks`. A simulation
    /// pins it to `election_ticks + 1` for reproducible runs.
    pub election_ticks_max: Option<usize>,
    pub heartbeat_ticks: usize,
    /// A snapshot of the lock table is taken, and the log compacted, every
    /// this many applied entries.
    pub snapshot_interval_entries: u64,
    /// raft-rs's limits on replication messages.
    pub max_inflight_msgs: usize,
    pub max_size_per_msg_bytes: u64,
}

/// The leases clients may ask for, and their expiry. Part of [`Config`].
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    /// The shortest and longest lease a client may ask for, by the names
    /// and with the defaults of fencelockd's `lease_min_ms` and
    /// `lease_max_ms` (2 s and 24 h). The shortest must be well above the
    /// election timeout (see [`Config::validate_timing`]), or locks would
    /// expire during a normal fail-over.
    pub lease_min_ms: u64,
    pub lease_max_ms: u64,
    /// How often the leader looks for due leases, on its own clock.
    pub expiry_scan_interval_ms: u64,
    /// Lock-delay, by key prefix (the longest matching prefix wins): a lock
    /// whose lease runs out (not one released) on a key under a prefix is
    /// held back that long, granted to no one, before the key is free
    /// (Chubby's lock-delay: it protects resources that cannot check
    /// tokens). The leader that proposes the Expire applies its own rules.
    /// Empty by default.
    pub lock_delays: Vec<(Vec<u8>, LeaseMs)>,
}

/// What one node holds at most: pending requests, locks, waiters, watches. Part of [`Config`].
#[derive(Clone, Debug)]
pub struct Limits {
    /// Client requests (proposals and reads) waiting or in flight at once;
    /// more are refused with [`RequestError::Overloaded`]. The leader's own
    /// Expires and ghost Releases do not count: they have
    /// `internal_pending_max`.
    pub pending_requests_max: usize,
    /// Of those, acquires (waiting ones included): more are refused with
    /// [`RequestError::Overloaded`] while renewals, releases and reads still
    /// find room under `pending_requests_max`.
    pub pending_acquires_max: usize,
    /// Acquires waiting for one key; more are refused with
    /// [`RequestError::TooManyWaiters`].
    pub waiters_per_key_max: usize,
    /// The leader's own requests (Expires, ghost Releases) pending at once:
    /// a budget of their own, so that leases expire on time whatever the
    /// client load.
    pub internal_pending_max: usize,
    /// Locks the table may hold; a grant of a new lock past it is refused
    /// with [`RequestError::QuotaExceeded`].
    pub locks_max: usize,
    /// Locks the owners of one identity (the owner up to its first `/`; the
    /// TLS user) may hold; as above.
    pub locks_per_identity_max: usize,
    /// The leader closes a log entry's batch once it holds this many
    /// commands (one request's commands are never split, so an entry may
    /// carry more).
    pub entry_commands_max: usize,
    /// The bytes of recent changes kept for watches ([`crate::watch`]): a
    /// watch further behind is answered `compacted`, with the current
    /// holders.
    pub watch_history_bytes_max: usize,
    /// Watches parked at once, waiting for a change.
    pub watches_max: usize,
    /// Watches parked at once on one client connection.
    pub watches_per_connection_max: usize,
}

/// How a node with a blank store starts, and the cluster it founds. Part of [`Config`].
#[derive(Clone, Debug)]
pub struct Founding {
    /// The id this node names the cluster with if it leads a cluster that
    /// has none yet (see [`Command::Bootstrap`](fencelock_types::Command)).
    /// fencelockd draws one at random at every start; the default, for
    /// tests, is made from the node id.
    pub cluster_id: ClusterId,
    /// How a node with a blank store starts (see [`crate::rejoin::decide`]).
    pub initial_cluster_state: crate::rejoin::ClusterState,
    /// How long a blank node that would found a cluster alone (it names
    /// no other voter) first listens for hellos: should a running cluster
    /// that added it contact it meanwhile, it does not found
    /// ([`FatalError::MemberElsewhere`]). fencelockd waits 2 s, past its
    /// peers' reconnection backoff; the default, 0, founds at once.
    pub founding_grace_ms: u64,
    /// The node joins a running cluster that added it as a learner
    /// (`fencelockd --join`): a blank store starts with no configuration
    /// and learns it from the leader; `voters` are then the members the
    /// cluster named, the only nodes it takes raft messages from until then.
    pub joining: bool,
    /// The token floor this node founds a cluster with (see
    /// [`Command::Bootstrap`](fencelock_types::Command)): fencelockd sets
    /// its wall clock in microseconds since the epoch at start, so that a
    /// cluster re-created from nothing issues tokens above its old ones.
    /// The default, 0, raises nothing (tokens start at 1).
    pub token_floor: u64,
    /// The command level this node founds a cluster at (see
    /// [`fencelock_types::LEVEL`]): this build's. Tests set 1 to start a
    /// cluster as a build before levels did.
    pub founding_level: u32,
}

impl Config {
    /// Settings for a cluster of `voters`, with defaults for the rest.
    pub fn new(id: NodeId, voters: Vec<NodeId>) -> Config {
        let cluster_id = {
            let mut bytes = [0; 16];
            bytes[..8].copy_from_slice(b"fencelck");
            bytes[8..].copy_from_slice(&id.0.to_le_bytes());
            ClusterId::new(bytes)
        };
        Config {
            id,
            voters,
            raft: RaftSettings {
                election_ticks: 10,
                election_ticks_max: None,
                heartbeat_ticks: 2,
                snapshot_interval_entries: 10_000,
                max_inflight_msgs: 256,
                max_size_per_msg_bytes: 1 << 20,
            },
            leases: LeaseSettings {
                lease_min_ms: 2_000,
                lease_max_ms: 24 * 60 * 60 * 1_000,
                expiry_scan_interval_ms: 10,
                lock_delays: Vec::new(),
            },
            limits: Limits {
                pending_requests_max: 65_536,
                pending_acquires_max: 32_768,
                waiters_per_key_max: 4_096,
                internal_pending_max: 65_536,
                locks_max: 1_000_000,
                locks_per_identity_max: 100_000,
                entry_commands_max: 4_096,
                watch_history_bytes_max: 16 << 20,
                watches_max: 4_096,
                watches_per_connection_max: 64,
            },
            founding: Founding {
                cluster_id,
                initial_cluster_state: crate::rejoin::ClusterState::New,
                founding_grace_ms: 0,
                joining: false,
                token_floor: 0,
                founding_level: fencelock_types::LEVEL,
            },
        }
    }

    /// The lock-delay for `key`: the rule of its longest matching prefix.
    pub fn lock_delay(&self, key: &[u8]) -> Option<LeaseMs> {
        fencelock_types::lock_delay_for(&self.leases.lock_delays, key)
    }

    /// Checks the lease bounds against the election timeout, given the
    /// wall-clock length of a tick: the shortest lease must be at least
    /// twice the longest election timeout.
    pub fn validate_timing(&self, tick_ms: u64) -> Result<(), ConfigError> {
        self.validate()?;
        let election_ticks_max = self.raft.election_ticks_max.unwrap_or(2 * self.raft.election_ticks) as u64;
        let election_timeout_ms = election_ticks_max.saturating_mul(tick_ms);
        if self.leases.lease_min_ms < 2 * election_timeout_ms {
            return Err(ConfigError(format!(
                "lease_min_ms ({} ms) must be at least twice the longest election timeout ({election_timeout_ms} ms)",
                self.leases.lease_min_ms
            )));
        }
        Ok(())
    }

    /// Checks the rules between fields.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |reason: String| Err(ConfigError(reason));
        if self.id.0 == 0 {
            return invalid("node id 0 is reserved".into());
        }
        if !self.founding.joining && !self.voters.contains(&self.id) {
            return invalid(format!("node {} is not among the voters {:?}", self.id.0, self.voters));
        }
        let mut voters = self.voters.clone();
        voters.sort();
        voters.dedup();
        if voters.len() != self.voters.len() || voters.contains(&NodeId(0)) {
            return invalid("voters must be distinct and non-zero".into());
        }
        if self.raft.heartbeat_ticks == 0 || self.raft.election_ticks <= self.raft.heartbeat_ticks {
            return invalid("election_ticks must be greater than heartbeat_ticks > 0".into());
        }
        if self.raft.election_ticks_max.is_some_and(|max| max <= self.raft.election_ticks) {
            return invalid("election_ticks_max must be greater than election_ticks".into());
        }
        if self.raft.snapshot_interval_entries == 0 {
            return invalid("snapshot_interval_entries must be positive".into());
        }
        let counts = [
            ("max_pending_requests", self.limits.pending_requests_max),
            ("max_pending_acquires", self.limits.pending_acquires_max),
            ("max_waiters_per_key", self.limits.waiters_per_key_max),
            ("internal_pending_max", self.limits.internal_pending_max),
            ("entry_commands_max", self.limits.entry_commands_max),
            ("max_locks", self.limits.locks_max),
            ("max_locks_per_owner", self.limits.locks_per_identity_max),
            ("max_watches", self.limits.watches_max),
            ("watch_history_bytes", self.limits.watch_history_bytes_max),
            ("max_watches_per_connection", self.limits.watches_per_connection_max),
        ];
        if let Some((name, _)) = counts.iter().find(|(_, value)| *value == 0) {
            return invalid(format!("{name} must be positive"));
        }
        if self.leases.lease_min_ms == 0 || self.leases.lease_min_ms > self.leases.lease_max_ms {
            return invalid(format!(
                "lease bounds must satisfy 0 < lease_min_ms <= lease_max_ms (got {} and {})",
                self.leases.lease_min_ms, self.leases.lease_max_ms
            ));
        }
        if self.leases.lease_max_ms > fencelock_types::LEASE_MS_MAX {
            return invalid(format!("lease_max_ms is over {} ms", fencelock_types::LEASE_MS_MAX));
        }
        if self.leases.expiry_scan_interval_ms == 0 {
            return invalid("expiry_scan_interval_ms must be positive".into());
        }
        Ok(())
    }
}

/// A config that breaks a rule between its fields.
#[derive(Debug, thiserror::Error)]
#[error("invalid driver config: {0}")]
pub struct ConfigError(pub String);

/// A linearizable read, answered through raft's ReadIndex.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Query {
    /// The lock on a key.
    Holder(Key),
    /// Whether `token` holds `key` right now.
    Check { key: Key, token: FencingToken },
    /// Up to `limit` locks whose keys start with `prefix`, in key order.
    List { prefix: Vec<u8>, limit: usize },
    /// The whole table (a backup): a clone, O(1), for the asker to encode
    /// off the node's thread.
    Table,
    /// The members of the configuration.
    Members,
}

/// A successful answer to a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    /// One result per proposed command, in order: the answer to commands
    /// proposed as given ([`crate::ClientRequest::Propose`]).
    Applied(Vec<ApplyResult>),
    /// An acquire's, of any kind.
    Acquired(crate::answer::Acquired),
    Released(crate::answer::Released),
    /// A renewal's: one per lock, in the order asked.
    Renewed(Vec<crate::answer::Renewal>),
    Proclaimed(crate::answer::Proclaimed),
    Opened(crate::answer::Opened),
    SessionKept(crate::answer::SessionKept),
    SessionClosed(crate::answer::SessionClosed),
    Holder(Option<HeldLock>),
    /// The holders of a read-write lock or a semaphore (a holder query of
    /// a shared key).
    Holders(Vec<HeldLock>),
    Check(bool),
    List(Vec<(Key, HeldLock)>),
    /// The table, as applied up to `index`. Boxed: the table is the
    /// largest answer by far and the rarest, and every other answer moves
    /// (from the applying replica to the client's connection) in the
    /// space of the largest.
    Table {
        table: Box<LockTable>,
        index: u64,
    },
    /// The membership, as applied up to `index` (after a change: the
    /// change's own entry).
    Members {
        members: Vec<Member>,
        index: u64,
    },
    /// Leadership moved to this voter.
    Transferred {
        leader: NodeId,
    },
    /// The changes a watch asked for.
    Watch(WatchAnswer),
}

/// A held lock as a read answers it: the lock, and the time left on its
/// lease by the answering node's clock (the leader's, for a linearizable
/// read). `None` when that node tracks no lease for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldLock {
    pub lock: Lock,
    pub remaining_ms: Option<u64>,
    /// For a holder of a read-write lock or a semaphore: how it holds the
    /// key (`lock` then carries its token, owner and lease, no value);
    /// `None` for a plain lock.
    pub share: Option<fencelock_types::Share>,
}

/// A change of the cluster's membership: one raft conf change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberChange {
    /// Adds a node that takes the log but does not vote. `known`: where
    /// the other members are reached, as the asking node knows (its
    /// `--peers`): recorded for members the directory does not name yet
    /// (those of the initial cluster), so that every member, the new one
    /// included, finds them in the replicated directory.
    AddLearner {
        id: NodeId,
        peer_addr: String,
        client_addr: String,
        known: Vec<(NodeId, fencelock_fsm::MemberAddrs)>,
    },
    /// Makes a learner that has caught up a voter.
    Promote(NodeId),
    /// Removes a voter or a learner.
    Remove(NodeId),
}

/// What a member is in the configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberRole {
    Voter,
    Learner,
    /// A voter of the incoming configuration only, while a joint change is
    /// under way.
    VoterJoining,
    /// A voter of the outgoing configuration only.
    VoterLeaving,
}

impl MemberRole {
    pub fn name(self) -> &'static str {
        match self {
            MemberRole::Voter => "voter",
            MemberRole::Learner => "learner",
            MemberRole::VoterJoining => "voter (joining)",
            MemberRole::VoterLeaving => "voter (leaving)",
        }
    }
}

/// A member of the cluster, with where it is reached when a membership
/// change said (members of the initial `--peers` are not in the directory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: NodeId,
    pub role: MemberRole,
    pub addrs: Option<fencelock_fsm::MemberAddrs>,
}

/// The answer to a request.
pub type Reply = Result<Response, RequestError>;

/// Who leads, as a not-leader answer says it.
fn leader_words(leader_hint: Option<NodeId>) -> String {
    match leader_hint {
        Some(leader) => format!("node {} leads", leader.0),
        None => "no leader is known yet".to_owned(),
    }
}

fn holder_words(holder_token: Option<FencingToken>) -> String {
    holder_token.map_or_else(String::new, |token| format!(", held under token {}", token.get()))
}

/// `ms` as a person writes it: `1500ms`, `2s`, `5m`, `24h`.
pub fn human_ms(ms: u64) -> String {
    match ms {
        0 => "0s".to_owned(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

/// Why a request was not answered with a result. `NotLeader`,
/// `LeadershipLost`, `Dropped`, `Overloaded` and `Stopped` are retryable (a
/// retried acquire with the same owner can never grant twice); `Held`,
/// `WaitTimedOut` and `LeaseOutOfBounds` are answers.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    /// This node is not the leader; nothing was proposed.
    #[error("this node is not the leader ({})", leader_words(*.leader_hint))]
    NotLeader { leader_hint: Option<NodeId> },
    /// Leadership was lost after the request was proposed: it may or may not
    /// take effect.
    #[error("leadership lost before the request applied; its outcome is unknown")]
    LeadershipLost { leader_hint: Option<NodeId> },
    /// raft-rs refused the proposal (for example, too much uncommitted
    /// data); nothing was proposed.
    #[error("proposal dropped by raft")]
    Dropped,
    /// Too many requests are pending; nothing was proposed.
    #[error("too many pending requests")]
    Overloaded,
    /// Too many acquires already wait for this key; nothing was proposed.
    #[error("{max} acquires already wait for key {key}")]
    TooManyWaiters { key: Key, max: usize },
    /// Too many watches already wait on this node, or on this connection.
    #[error("{max} watches already wait on this {}", if *per_connection { "connection" } else { "node" })]
    TooManyWatches { max: usize, per_connection: bool },
    /// A grant would take the table, or its owner's identity, past its
    /// quota of locks; nothing was proposed.
    #[error("{0}")]
    QuotaExceeded(Quota),
    /// A Grant in the request names a key another owner holds; nothing was
    /// proposed.
    #[error("key {key} is held under token {holder_token}")]
    Held { key: Key, holder_token: FencingToken },
    /// A Grant in the request names a key held back by lock-delay (its lock
    /// under `holder_token` expired); nothing was proposed. `left_ms`: how
    /// long the delay still lasts by this leader's clock, if it knows.
    #[error(
        "key {key} is held back by lock-delay after token {holder_token} expired{}",
        left_ms.map(|ms| format!("; it can be granted again in {}", human_ms(ms))).unwrap_or_default()
    )]
    Delayed { key: Key, holder_token: FencingToken, left_ms: Option<u64> },
    /// A waiting acquire's time ran out before the key was free.
    #[error("waited in vain for key {key}{}", holder_words(*.holder_token))]
    WaitTimedOut { key: Key, holder_token: Option<FencingToken> },
    /// A Grant or Renew asked for a lease outside the configured bounds.
    #[error(
        "a lease of {} is outside the allowed range, {} to {}",
        human_ms(*.lease_ms),
        human_ms(*.min_ms),
        human_ms(*.max_ms)
    )]
    LeaseOutOfBounds { lease_ms: u64, min_ms: u64, max_ms: u64 },
    /// The node stopped before answering.
    #[error("node stopped")]
    Stopped,
    /// A membership change that cannot be made: an unknown member, an id
    /// taken with other addresses, the last voter. Nothing was proposed.
    #[error("{0}")]
    BadMemberChange(String),
    /// A membership change that cannot be made now (another is under way,
    /// the learner has not caught up); nothing was proposed. Retryable.
    #[error("{0}")]
    MemberChangeBusy(String),
    /// A leadership transfer that did not complete.
    #[error("{0}")]
    TransferFailed(String),
    /// A command the cluster's command level does not have yet (a
    /// read-write lock, a semaphore, a value, a proclaim): not every
    /// member has said it runs a build that knows it. Nothing was
    /// proposed. Retryable once every node is upgraded.
    #[error(
        "the cluster is at command level {level} and this needs level {needed} ({}); {}",
        level_features(*needed),
        level_words(behind)
    )]
    LevelNotReached { needed: u32, level: u32, behind: Vec<NodeId> },
    /// A bug: a reply of the wrong shape, for example.
    #[error("internal error: {0}")]
    Internal(String),
}

/// What command level `level` brought, for the refusal's message.
fn level_features(level: u32) -> &'static str {
    match level {
        2 => "read-write locks, semaphores, values and proclaim",
        3 => "sessions",
        _ => "commands this cluster does not apply yet",
    }
}

fn level_words(behind: &[NodeId]) -> String {
    if behind.is_empty() {
        "every member runs a build that knows it: the leader raises the level within a second".to_owned()
    } else {
        let ids: Vec<String> = behind.iter().map(|id| id.0.to_string()).collect();
        format!(
            "upgrade every node first: node {} has not said it runs a build that knows it",
            ids.join(", node ")
        )
    }
}

/// Which quota of locks a grant met ([`RequestError::QuotaExceeded`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Quota {
    #[error("the lock table is full: it holds {max} locks, its maximum")]
    Table { max: usize },
    #[error("owners of identity {identity:?} hold {max} locks, their maximum")]
    Identity { identity: String, max: usize },
}

/// A change of the lock table, for the lease timer. Emitted on every node as
/// entries apply, in log order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppliedEvent {
    /// A lock was granted (`existing`: re-granted to its holder, lease restarted).
    Granted {
        key: Key,
        token: FencingToken,
        lease_ms: LeaseMs,
        existing: bool,
        /// The session it is held under (its lease is the session's).
        session: Option<FencingToken>,
    },
    Renewed {
        key: Key,
        token: FencingToken,
        lease_ms: LeaseMs,
    },
    Released {
        key: Key,
        token: FencingToken,
    },
    Expired {
        key: Key,
        token: FencingToken,
        /// The leader that proposed the Expire, as its entry names it.
        proposer: Option<NodeId>,
    },
    /// The lock's lease ran out, under a lock-delay rule: it no longer holds
    /// the key, which stays held back under the same token, granted to no
    /// one, for `delay_ms` (then [`AppliedEvent::DelayLifted`]).
    Delayed {
        key: Key,
        token: FencingToken,
        delay_ms: LeaseMs,
        proposer: Option<NodeId>,
    },
    /// The holder of `token` proclaimed a new value for its lock.
    Proclaimed {
        key: Key,
        token: FencingToken,
    },
    /// The key held back after `token` expired is free: the delay ran out
    /// (an Expire proposed by `proposer`), or an administrative
    /// force-release lifted it early (`forced`).
    DelayLifted {
        key: Key,
        token: FencingToken,
        proposer: Option<NodeId>,
        forced: bool,
    },
    /// The table was replaced by a snapshot; rebuild from [`Replica::table`](crate::Replica::table).
    Restored,
    /// A session was opened (its id a token from the one counter), or
    /// renewed (by a keep-alive, or a renew of something it holds).
    SessionOpened {
        session: FencingToken,
        ttl_ms: LeaseMs,
    },
    SessionRenewed {
        session: FencingToken,
        ttl_ms: LeaseMs,
    },
    /// A session ended: closed, or lapsed (`expired`, proposed by
    /// `proposer`). Each holder it had came before this event, as a
    /// Released, Expired or Delayed of its own, in the same entry.
    SessionEnded {
        session: FencingToken,
        expired: bool,
        proposer: Option<NodeId>,
    },
}

impl AppliedEvent {
    /// The key a holder's event is of; none for a session's or a restore.
    pub fn key(&self) -> Option<&Key> {
        match self {
            AppliedEvent::Granted { key, .. }
            | AppliedEvent::Renewed { key, .. }
            | AppliedEvent::Released { key, .. }
            | AppliedEvent::Expired { key, .. }
            | AppliedEvent::Delayed { key, .. }
            | AppliedEvent::Proclaimed { key, .. }
            | AppliedEvent::DelayLifted { key, .. } => Some(key),
            AppliedEvent::Restored
            | AppliedEvent::SessionOpened { .. }
            | AppliedEvent::SessionRenewed { .. }
            | AppliedEvent::SessionEnded { .. } => None,
        }
    }
}

/// Leadership as this node sees it, reported when it changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RoleChange {
    Follower {
        term: u64,
        leader: Option<NodeId>,
    },
    Candidate {
        term: u64,
    },
    /// Elected, but nothing of its own term is applied yet.
    Leader {
        term: u64,
    },
    /// The leader applied an entry of its own term: it may now propose.
    LeaderReady {
        term: u64,
    },
}

/// An error that stops the node.
#[derive(Debug, thiserror::Error)]
pub enum FatalError {
    #[error("storage failed: {0}")]
    Storage(#[from] StorageError),
    #[error("raft failed: {0}")]
    Raft(#[from] raft::Error),
    #[error("stored snapshot does not restore: {0}")]
    Snapshot(#[from] fencelock_fsm::SnapshotError),
    /// The snapshot in a file of the store does not restore: the file is
    /// corrupt (or was written by another program).
    #[error("the snapshot in {file} does not restore: {error}")]
    StoredSnapshot { file: String, error: fencelock_fsm::SnapshotError },
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// This node is not a member of the configuration it applied (or that
    /// its store holds): it was removed from the cluster.
    #[error("this node was removed from the cluster (the configuration at index {index} does not hold it)")]
    Removed { index: u64 },
    /// The cluster's command level is above this build's: the entries that
    /// follow may hold commands it does not know, which it would skip
    /// while the other replicas apply them.
    #[error(
        "the cluster is at command level {level} and this build applies up to level {}: run a newer fencelockd",
        fencelock_types::LEVEL
    )]
    TooOld { level: u32 },
    /// The store is blank and node `by`, of a running cluster that this
    /// node's configuration does not name, contacted it: the cluster
    /// added this node (`fencelock member add`). Founding a cluster of its
    /// own would grant locks that cluster holds; it must start with
    /// `--join` instead.
    #[error(
        "this node's data directory is empty, and node {by} of a running cluster contacted it as a member: it \
         must join that cluster (start it with --join and the cluster's client endpoints), not found a new one"
    )]
    MemberElsewhere { by: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_read_as_sentences_with_human_durations() {
        assert_eq!(
            RequestError::NotLeader { leader_hint: None }.to_string(),
            "this node is not the leader (no leader is known yet)"
        );
        assert_eq!(
            RequestError::NotLeader { leader_hint: Some(NodeId(2)) }.to_string(),
            "this node is not the leader (node 2 leads)"
        );
        let lease = RequestError::LeaseOutOfBounds { lease_ms: 1_000, min_ms: 2_000, max_ms: 86_400_000 };
        assert_eq!(lease.to_string(), "a lease of 1s is outside the allowed range, 2s to 24h");
        let key = Key::new(b"jobs/a".to_vec()).unwrap();
        let waited = RequestError::WaitTimedOut { key: key.clone(), holder_token: FencingToken::new(7) };
        assert_eq!(waited.to_string(), "waited in vain for key jobs/a, held under token 7");
        assert_eq!(
            RequestError::WaitTimedOut { key, holder_token: None }.to_string(),
            "waited in vain for key jobs/a"
        );
        for (ms, text) in [(0, "0s"), (1_500, "1500ms"), (90_000, "90s"), (300_000, "5m"), (7_200_000, "2h")]
        {
            assert_eq!(human_ms(ms), text);
        }
    }

    /// Every answer moves from the applying replica to its connection a
    /// few times, by value: past 128 bytes each move is a call to memcpy
    /// rather than a few stores (the table in `Response::Table` made it
    /// 152 bytes and cost the distinct-key benchmarks a few percent).
    #[test]
    fn answers_stay_small_enough_to_move_inline() {
        let size = std::mem::size_of::<Result<Response, RequestError>>();
        assert!(size <= 128, "a reply is {size} bytes");
    }
}

/// What changed on a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WatchKind {
    /// A new holder, under a new token.
    Granted,
    /// The holder released the lock (or it was released by force).
    Released,
    /// The holder's lease ran out.
    Expired,
    /// The holder's lease ran out and the key is held back by lock-delay.
    Delayed,
    /// The lock-delay is over (or was lifted by force): the key is free.
    DelayLifted,
    /// The holder proclaimed a new value.
    Proclaimed,
}

impl WatchKind {
    /// The stable lower-case name used on the wire's JSON and in logs.
    pub fn name(self) -> &'static str {
        match self {
            WatchKind::Granted => "granted",
            WatchKind::Released => "released",
            WatchKind::Expired => "expired",
            WatchKind::Delayed => "delayed",
            WatchKind::DelayLifted => "delay_lifted",
            WatchKind::Proclaimed => "proclaimed",
        }
    }
}

/// One change, with the index of the log entry that made it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchEvent {
    pub index: u64,
    pub key: Key,
    pub kind: WatchKind,
    /// The token of the lock the change is about.
    pub token: FencingToken,
    /// The lock's owner (a grant: the new holder).
    pub owner: Owner,
    /// The lock's value after the change.
    pub value: Value,
}

/// The answer to a watch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchAnswer {
    /// Changes after the asked index, in log order.
    pub events: Vec<WatchEvent>,
    /// The holders of the watched keys as of `index`: given when the watch
    /// started (no position) or when its position was compacted away
    /// (`compacted`); `None` otherwise.
    /// Each holder says how it holds the key (`share`: `None` for a plain
    /// lock); `remaining_ms` is not given.
    pub current: Option<Vec<(Key, HeldLock)>>,
    /// The position was older than this node's history: changes may have
    /// been missed, and `current` says where things stand.
    pub compacted: bool,
    /// Every change to the watched keys up to this index has been told
    /// (here or before): the next watch asks for the changes after it.
    /// Never below the asked index.
    pub index: u64,
}
