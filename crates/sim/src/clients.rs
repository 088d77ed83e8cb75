//! The simulated clients, which behave like real ones: each talks to one
//! node at a time over a connection of its own, follows leader hints, and
//! when its connection drops mid-request (a reset, a crashed node, a
//! timeout) sends the same request again, same owner, on a new connection
//! to the same or another node, as docs/protocol.md tells clients to.
//! Some give an acquire up instead (a disconnect): what it is granted is a
//! ghost the node must release.
//!
//! The last `SimConfig::shared_clients` clients take a read-write lock (as
//! readers or the writer) and permits of a semaphore instead of plain
//! locks, on keys under [`shared::PREFIX`], and read and watch those keys.
//! Every acquire of the semaphore names the same permits, so that it is
//! never answered Mismatch by accident; a holder sometimes asks for its key
//! in another kind on purpose, and must be answered Mismatch.
//!
//! The last `SimConfig::session_clients` clients open a session (its TTL
//! drawn within the lease bounds) and acquire several keys under it: the
//! plain keys the other clients contend for, a reader or the writer of
//! the read-write lock, a permit of the semaphore. They keep it alive with
//! keep-alives (or a renew of a lock it holds), release a key of it now
//! and then, and in the end close it or abandon it (it must lapse and free
//! everything). A session found gone (NoSession) is replaced by a new one.
//!
//! A cluster founded at an older command level (`upgrade.rs`) refuses what
//! needs a level it has not reached (`RequestError::LevelNotReached`),
//! proposing nothing: a plain client then takes its lock without a value,
//! as a client of an older cluster does, and every other client asks again
//! a while later (a holder's probe goes back to its holding).

use fencelock_raft::answer::{Acquired, Opened, Released, Renewal, SessionClosed, SessionKept};
use fencelock_raft::reply::{Checked, Holding, Listed};
use fencelock_raft::watch::WatchAnswer;
use fencelock_raft::watch::WatchQuery;
use fencelock_raft::{Answer, ClientRequest, Query, Reply, RequestError, Response};
use fencelock_types::{Command, FencingToken, Key, LeaseMs, Share, Value};

use crate::client::{ClientState, Op, OpenSession};
use crate::invariants::shared;
use crate::world::{Ask, Event, World};

/// A session's TTL is drawn from this range (within the world's lease
/// bounds), in ms.
const SESSION_TTL_MS: (u64, u64) = (500, 5_000);

/// How long a client waits for an answer before it gives the connection up.
const REQUEST_TIMEOUT_MS: u64 = 3_000;
/// After the heal, how long before clients must be served again.
const HEAL_SETTLE_MS: u64 = 1_000;
/// The keys clients contend on: k0, k1, ...
const KEYS: u64 = 3;
/// The read-write lock and the semaphore the shared clients contend on.
const RW_KEY: &[u8] = b"k-rw";
const SEMAPHORE_KEY: &[u8] = b"k-sem";
/// The semaphore's permits, in every acquire but a holder's probe.
const SEMAPHORE_PERMITS: u32 = 2;
/// How often a shared holder, instead of renewing, asks for its key in
/// another kind, per million wakes.
const PROBE_PPM: u64 = 50_000;
/// The most locks a simulated list asks for (more than clients can hold).
const LIST_LIMIT: usize = 100;
/// How long a client refused for the cluster's command level waits before
/// it asks again, in ms: the leader raises it once every member is
/// upgraded, which takes a while.
const LEVEL_RETRY_MS: (u64, u64) = (100, 1_000);

/// The events one watch answer holds (about): small, so that answers end
/// at entry boundaries often.
const WATCH_LIMIT: usize = 3;

impl World {
    /// Sets `client`'s timer, replacing any earlier one.
    pub(crate) fn wake_client(&mut self, client: usize, delay_ms: u64) {
        self.clients[client].generation += 1;
        let generation = self.clients[client].generation;
        self.schedule(delay_ms, Event::Client { client, generation });
    }

    pub(crate) fn client_wakes(&mut self, client: usize) -> Result<(), String> {
        if self.finished {
            return Ok(());
        }
        let state = std::mem::replace(&mut self.clients[client].state, ClientState::Idle);
        match state {
            ClientState::Idle => {
                let op = if self.clients[client].sessions {
                    match self.next_session_op(client) {
                        Some(op) => op,
                        // Nothing to do yet: its timer is set.
                        None => return Ok(()),
                    }
                } else {
                    self.next_op(client)
                };
                self.send_request(client, op)
            }
            ClientState::Retrying { op } => self.send_request(client, op),
            ClientState::Waiting { op, deadline_ms, .. } if self.now_ms >= deadline_ms => {
                // No answer: give the connection up and send the same
                // request again elsewhere (a grant it got meanwhile is
                // re-granted to the same owner, or released as a ghost).
                self.close_connection(client);
                self.clients[client].target = (self.clients[client].target + 1) % self.nodes.len();
                self.send_request(client, op)
            }
            waiting @ ClientState::Waiting { .. } => {
                self.clients[client].state = waiting;
                Ok(())
            }
            ClientState::Holding { key, token, lease_ms, release_at_ms } => {
                // After the heal every client must get its final key, so it
                // lets go of what it holds.
                let must_finish = self.healed && !self.clients[client].served_after_heal;
                let op = if self.now_ms >= release_at_ms || must_finish {
                    self.let_go(client);
                    Op::Release { key, token }
                } else if shared::is_shared(key.as_bytes()) && self.rng.chance(PROBE_PPM) {
                    // Of the other kind: a permit of a read-write lock, a
                    // reader or one permit more of the semaphore.
                    let share = if key.as_bytes() == RW_KEY {
                        Share::Permit(SEMAPHORE_PERMITS)
                    } else {
                        self.rng.pick(&[Share::Read, Share::Permit(SEMAPHORE_PERMITS + 1)])
                    };
                    Op::Probe { key, share, token, lease_ms, release_at_ms }
                } else {
                    Op::Renew { key, token, lease_ms, release_at_ms }
                };
                self.send_request(client, op)
            }
        }
    }

    /// `client` lets go of what it holds (it is sending a release, or was
    /// told its lock is gone).
    fn let_go(&mut self, client: usize) {
        self.checker.holders.released(client);
        self.checker.shared.released(client, self.now_ms);
    }

    fn next_op(&mut self, client: usize) -> Op {
        let after_heal = self.healed && self.now_ms >= self.config.fault_ms + HEAL_SETTLE_MS;
        let must_finish = after_heal && !self.clients[client].served_after_heal;
        if self.clients[client].shared && !must_finish {
            return self.next_shared_op(client, after_heal);
        }
        let key = if must_finish {
            self.clients[client].final_key.clone()
        } else {
            let name = format!("k{}", self.rng.range(0, KEYS));
            Key::new(name.into_bytes()).expect("a valid key")
        };
        if !after_heal && self.rng.chance(200_000) {
            return match self.rng.range(0, 4) {
                0 => Op::Get { key },
                3 => Op::Watch {
                    prefix: b"k".to_vec(),
                    after: self.clients[client].watch_at,
                    wait_ms: self.rng.pick(&[0, 400]),
                },
                1 => {
                    let highest = self.checker.tokens.highest_issued().map_or(1, FencingToken::get);
                    let token = FencingToken::new(self.rng.range(1, highest + 1)).expect("a token from 1");
                    Op::Check { key, token }
                }
                _ => Op::List { prefix: b"k".to_vec() },
            };
        }
        let lease_ms = LeaseMs::new(self.rng.pick(&[600, 1_500, 4_000])).expect("a valid lease");
        let wait_ms = self.rng.pick(&[0, 0, 300, 2_000]);
        Op::Acquire { key, lease_ms, wait_ms, value: true }
    }

    /// A shared client's next request: mostly an acquire, as a reader (or,
    /// a third of the time, the writer) of the read-write lock or of a
    /// permit of the semaphore, half and half; sometimes a read or a watch.
    fn next_shared_op(&mut self, client: usize, after_heal: bool) -> Op {
        let rw = self.rng.chance(500_000);
        let key = Key::new(if rw { RW_KEY } else { SEMAPHORE_KEY }.to_vec()).expect("a valid key");
        if !after_heal && self.rng.chance(200_000) {
            return match self.rng.range(0, 3) {
                0 => Op::Get { key },
                1 => Op::List { prefix: shared::PREFIX.to_vec() },
                _ => Op::Watch {
                    prefix: shared::PREFIX.to_vec(),
                    after: self.clients[client].watch_at,
                    wait_ms: self.rng.pick(&[0, 400]),
                },
            };
        }
        let share = match rw {
            true if self.rng.chance(333_333) => Share::Write,
            true => Share::Read,
            false => Share::Permit(SEMAPHORE_PERMITS),
        };
        let lease_ms = LeaseMs::new(self.rng.pick(&[600, 1_500, 4_000])).expect("a valid lease");
        let wait_ms = self.rng.pick(&[0, 0, 300, 2_000]);
        Op::AcquireShared { key, share, lease_ms, wait_ms }
    }

    /// A session client's next request, or none for now (its timer is then
    /// set). Without a session it opens one; with one, it keeps it alive
    /// every third of its TTL (sometimes by renewing a lock it holds),
    /// acquires what it planned under it, now and then releases one key,
    /// and ends it when it meant to: closes it, or abandons it (stops
    /// keeping it alive). After the heal it ends its session and gets its
    /// final key as a plain client does.
    fn next_session_op(&mut self, client: usize) -> Option<Op> {
        let after_heal = self.healed && self.now_ms >= self.config.fault_ms + HEAL_SETTLE_MS;
        let must_finish = after_heal && !self.clients[client].served_after_heal;
        let Some(open) = self.clients[client].session.as_ref() else {
            if must_finish {
                return Some(self.next_op(client));
            }
            let ttl_ms = self.rng.range(SESSION_TTL_MS.0, SESSION_TTL_MS.1 + 1);
            return Some(Op::OpenSession {
                ttl_ms: LeaseMs::new(ttl_ms).expect("a TTL within the lease bounds"),
            });
        };
        let (session, keep_alive_at_ms, end_at_ms, close) =
            (open.id, open.keep_alive_at_ms, open.end_at_ms, open.close);
        let held = open.held.len() as u64;
        if must_finish || self.now_ms >= end_at_ms {
            self.clients[client].session = None;
            if close {
                // What it holds is freed by the close: nothing is promised
                // from now on.
                self.checker.sessions.closing(session);
                self.note(&format!("client {} closes session {session}", client + 1));
                return Some(Op::CloseSession { session });
            }
            // What it was promised stands: the session lapses later.
            self.note(&format!("client {} abandons session {session}", client + 1));
            let pause = self.rng.range(50, 300);
            self.wake_client(client, pause);
            return None;
        }
        if self.now_ms >= keep_alive_at_ms {
            if held > 0 && self.rng.chance(300_000) {
                let at = self.rng.range(0, held) as usize;
                let open = self.clients[client].session.as_ref().expect("open");
                let (key, token) = open.held[at].clone();
                return Some(Op::RenewIn { key, token, session });
            }
            return Some(Op::KeepAlive { session });
        }
        if let Some((key, share)) = self.clients[client].session.as_mut().and_then(|open| open.plan.pop()) {
            let wait_ms = self.rng.pick(&[0, 0, 300, 2_000]);
            return Some(Op::AcquireIn { key, share, session, wait_ms });
        }
        if held > 0 && self.rng.chance(100_000) {
            let at = self.rng.range(0, held) as usize;
            let open = self.clients[client].session.as_mut().expect("open");
            let (key, token) = open.held.remove(at);
            self.checker.sessions.released(&key, token);
            return Some(Op::ReleaseIn { key, token });
        }
        let next_ms = keep_alive_at_ms.min(end_at_ms);
        self.wake_client(client, next_ms.saturating_sub(self.now_ms).max(1));
        None
    }

    /// What a session client means to hold under a new session: one to
    /// four of the plain keys, a reader or the writer of the read-write
    /// lock and a permit of the semaphore, in random order.
    fn session_plan(&mut self) -> Vec<(Key, Option<Share>)> {
        let mut choices: Vec<(Key, Option<Share>)> =
            (0..KEYS).map(|n| (Key::new(format!("k{n}").into_bytes()).expect("a valid key"), None)).collect();
        let rw = if self.rng.chance(250_000) { Share::Write } else { Share::Read };
        choices.push((Key::new(RW_KEY.to_vec()).expect("a valid key"), Some(rw)));
        choices.push((
            Key::new(SEMAPHORE_KEY.to_vec()).expect("a valid key"),
            Some(Share::Permit(SEMAPHORE_PERMITS)),
        ));
        let count = self.rng.range(1, 5) as usize;
        let mut plan = Vec::with_capacity(count);
        for _ in 0..count {
            let at = self.rng.range(0, choices.len() as u64) as usize;
            plan.push(choices.swap_remove(at));
        }
        plan
    }

    /// The client's connection to its target, opened if it has none.
    fn connection(&mut self, client: usize) -> Option<u64> {
        let target = self.clients[client].target;
        if let Some((node, conn)) = self.clients[client].conn {
            if node == target && self.client_conns.contains(&conn) {
                return Some(conn);
            }
            self.close_connection(client);
        }
        self.nodes[target].node.as_ref()?;
        self.next_conn += 1;
        let conn = self.next_conn;
        self.client_conns.insert(conn);
        self.nodes[target].conns.insert(conn);
        self.clients[client].conn = Some((target, conn));
        Some(conn)
    }

    /// The client closes its connection; the node hears of it after the
    /// requests sent on it (one TCP stream).
    pub(crate) fn close_connection(&mut self, client: usize) {
        let Some((node, conn)) = self.clients[client].conn.take() else { return };
        if self.client_conns.remove(&conn) {
            let delay = self.network.delay_min_ms + self.network.delay_jitter_ms + 1;
            self.schedule(delay, Event::Close { node, conn });
        }
    }

    /// The node side of `conn` is gone (it crashed): its client learns at
    /// once, and sends what it waited for again elsewhere.
    pub(crate) fn connection_reset(&mut self, conn: u64) {
        self.client_conns.remove(&conn);
        if self.operator_connection_reset(conn) {
            return;
        }
        let Some(client) = self.clients.iter().position(|c| c.conn.is_some_and(|(_, open)| open == conn))
        else {
            return;
        };
        self.clients[client].conn = None;
        self.clients[client].target = (self.clients[client].target + 1) % self.nodes.len();
        // A holder keeps its lock: its next renewal opens a new connection.
        let state = std::mem::replace(&mut self.clients[client].state, ClientState::Idle);
        self.clients[client].state = match state {
            ClientState::Waiting { op, .. } => {
                let pause = self.rng.range(1, 50);
                self.wake_client(client, pause);
                ClientState::Retrying { op }
            }
            other => other,
        };
    }

    fn send_request(&mut self, client: usize, op: Op) -> Result<(), String> {
        let Some(conn) = self.connection(client) else {
            // Connection refused: the client tries the next node shortly.
            self.clients[client].target = (self.clients[client].target + 1) % self.nodes.len();
            self.clients[client].state = ClientState::Retrying { op };
            self.wake_client(client, 10);
            return Ok(());
        };
        let node = self.clients[client].target;
        self.clients[client].next_seq += 1;
        let seq = self.clients[client].next_seq;
        let ask = Ask { client, seq, conn };
        let owner = self.clients[client].owner.clone();
        let user = self.clients[client].user.clone();
        let request = match op.clone() {
            Op::Acquire { key, lease_ms, wait_ms, value } => {
                let value = match value {
                    true => Value::new(owner.as_bytes().to_vec()).unwrap_or_default(),
                    false => Value::none(),
                };
                ClientRequest::Acquire { key, lease_ms, owner, value, wait_ms }
            }
            Op::AcquireShared { key, share, lease_ms, wait_ms } => {
                ClientRequest::AcquireShared { key, lease_ms, owner, share, wait_ms }
            }
            Op::Probe { key, share, lease_ms, .. } => {
                ClientRequest::AcquireShared { key, lease_ms, owner, share, wait_ms: 0 }
            }
            Op::Renew { key, token, lease_ms, .. } => {
                ClientRequest::Renew { locks: vec![(key, token)], lease_ms, user }
            }
            Op::Release { key, token } => ClientRequest::Release { key, token: Some(token), user },
            Op::OpenSession { ttl_ms } => ClientRequest::OpenSession { owner, ttl_ms },
            Op::KeepAlive { session } => ClientRequest::KeepAlive { session, user },
            Op::CloseSession { session } => ClientRequest::CloseSession { session, user },
            Op::AcquireIn { key, share, session, wait_ms } => {
                // The lease is the session's: the one asked is ignored.
                let lease_ms = LeaseMs::new(600).expect("a valid lease");
                let grant = match share {
                    Some(share) => {
                        Command::GrantShared { key, lease_ms, owner, share, session: Some(session) }
                    }
                    None => {
                        let value = Value::new(owner.as_bytes().to_vec()).unwrap_or_default();
                        Command::Grant { key, lease_ms, owner, value, session: Some(session) }
                    }
                };
                ClientRequest::AcquireWith { grant, wait_ms }
            }
            Op::RenewIn { key, token, .. } => {
                // The lease asked is the session's TTL's business.
                let lease_ms = LeaseMs::new(600).expect("a valid lease");
                ClientRequest::Renew { locks: vec![(key, token)], lease_ms, user }
            }
            Op::ReleaseIn { key, token } => ClientRequest::Release { key, token: Some(token), user },
            Op::Get { key } => ClientRequest::Read(Query::Holder(key)),
            Op::Check { key, token } => ClientRequest::Read(Query::Check { key, token }),
            Op::List { prefix } => ClientRequest::Read(Query::List { prefix, limit: LIST_LIMIT }),
            Op::Watch { prefix, after, wait_ms } => {
                ClientRequest::Watch(WatchQuery { prefix, after, wait_ms, limit: WATCH_LIMIT })
            }
        };
        if self.trace_clients {
            self.note(&format!("client {} sends {seq} {op:?} to {} on {conn}", client + 1, node + 1));
        }
        // Requests on one connection arrive in order, before its close.
        let delay = self.network.delay_min_ms + self.network.delay_jitter_ms / 2;
        self.schedule(delay, Event::Request { node, conn, ask, request });
        let wait_ms = match &op {
            Op::Acquire { wait_ms, .. }
            | Op::AcquireShared { wait_ms, .. }
            | Op::AcquireIn { wait_ms, .. }
            | Op::Watch { wait_ms, .. } => *wait_ms,
            _ => 0,
        };
        let deadline_ms = self.now_ms + REQUEST_TIMEOUT_MS + wait_ms;
        if let Op::Acquire { .. } | Op::AcquireShared { .. } | Op::AcquireIn { .. } = &op {
            if self.rng.chance(self.swarm.abandon_ppm) {
                // The client disconnects right after asking, and gives up.
                self.note(&format!("client {} abandons {seq} on connection {conn}", client + 1));
                self.close_connection(client);
                self.clients[client].state = ClientState::Idle;
                let pause = self.rng.range(50, 300);
                self.wake_client(client, pause);
                return Ok(());
            }
            if self.rng.chance(self.swarm.reset_ppm) {
                // The connection drops before the answer; the client sends
                // the same acquire again on a new one, at once or soon, to
                // the same node or the next.
                self.note(&format!("client {} connection {conn} resets after {seq}", client + 1));
                self.close_connection(client);
                if self.rng.chance(500_000) {
                    self.clients[client].target = (node + 1) % self.nodes.len();
                }
                self.clients[client].state = ClientState::Retrying { op };
                let pause = self.rng.range(0, 30);
                self.wake_client(client, pause);
                return Ok(());
            }
        }
        self.clients[client].state = ClientState::Waiting { seq, op, sent_ms: self.now_ms, deadline_ms };
        self.wake_client(client, deadline_ms - self.now_ms);
        Ok(())
    }

    /// An answer arrives; one for a request the client no longer waits for
    /// (or on a connection it closed) is dropped.
    pub(crate) fn client_reply(&mut self, ask: Ask, reply: Reply) -> Result<(), String> {
        let client = ask.client;
        if self.clients[client].conn.map(|(_, conn)| conn) != Some(ask.conn) {
            return Ok(());
        }
        let ClientState::Waiting { seq, op, sent_ms, .. } =
            std::mem::replace(&mut self.clients[client].state, ClientState::Idle)
        else {
            return Ok(());
        };
        if seq != ask.seq {
            return Ok(());
        }
        self.client_answered(client, op, sent_ms, reply)
    }

    fn client_answered(&mut self, client: usize, op: Op, sent_ms: u64, reply: Reply) -> Result<(), String> {
        if self.trace_clients {
            self.note(&format!("client {} answered {op:?}: {reply:?}", client + 1));
        }
        let pause = self.rng.range(5, 100);
        let response = match reply {
            Ok(response) => response,
            Err(err) => return self.client_refused(client, op, sent_ms, err, pause),
        };
        // Each arm takes its operation's own answer: an answer of another
        // operation fails the run in `answer_of`, the one place that pairs.
        match op {
            Op::Acquire { key, lease_ms, .. } => match answer_of::<Acquired>(client, response)? {
                Acquired::Granted { token, .. } => {
                    self.grants += 1;
                    self.checker.durability.acked_grant(&key, token);
                    self.checker.holders.granted(client, &key, token, sent_ms, lease_ms.get())?;
                    self.note(&format!("client {} granted {key} {token}", client + 1));
                    self.hold(client, key, token, lease_ms);
                }
                // Decided before proposing (a `Held` error), never at apply;
                // a plain key outside a session is never of another kind.
                refused @ (Acquired::Held { .. }
                | Acquired::Mismatch { .. }
                | Acquired::NoSession { .. }
                | Acquired::NotSessionOwner { .. }) => {
                    return Err(format!("client {}: acquire answered {refused:?}", client + 1))
                }
            },
            Op::AcquireShared { key, share, lease_ms, .. } => {
                match answer_of::<Acquired>(client, response)? {
                    Acquired::Granted { token, .. } => {
                        self.grants += 1;
                        self.checker.durability.acked_grant(&key, token);
                        self.checker.shared.granted(client, &key, token, share, sent_ms, lease_ms.get())?;
                        self.note(&format!("client {} granted {key} {token} as {share:?}", client + 1));
                        self.hold(client, key, token, lease_ms);
                    }
                    // The key is of another kind: a holder's probe was granted,
                    // and its holder has not let go yet.
                    Acquired::Mismatch { permits } => {
                        self.checker.shared.mismatched(client, share, Some(permits))?;
                        self.wake_client(client, pause);
                    }
                    refused @ (Acquired::Held { .. }
                    | Acquired::NoSession { .. }
                    | Acquired::NotSessionOwner { .. }) => {
                        return Err(format!("client {}: shared acquire answered {refused:?}", client + 1))
                    }
                }
            }
            Op::Probe { key, share, token, lease_ms, release_at_ms } => {
                let answer = answer_of::<Acquired>(client, response)?;
                let permits = match answer {
                    Acquired::Mismatch { permits } => Some(permits),
                    _ => None,
                };
                self.checker.shared.probed(client, share, permits, sent_ms, self.now_ms)?;
                match answer {
                    Acquired::Mismatch { .. } => {
                        self.clients[client].state =
                            ClientState::Holding { key, token, lease_ms, release_at_ms };
                        self.wake_client(client, pause);
                    }
                    // The key was free, so its lock is gone: it holds the
                    // probe's instead, and hands it back at its next wake.
                    Acquired::Granted { token: granted, .. } => {
                        self.let_go(client);
                        self.grants += 1;
                        self.checker.durability.acked_grant(&key, granted);
                        self.checker.shared.granted(client, &key, granted, share, sent_ms, lease_ms.get())?;
                        self.note(&format!(
                            "client {} granted {key} {granted} as {share:?} by its probe",
                            client + 1
                        ));
                        let release_at_ms = self.now_ms;
                        self.clients[client].state =
                            ClientState::Holding { key, token: granted, lease_ms, release_at_ms };
                        self.wake_client(client, pause);
                    }
                    refused @ (Acquired::Held { .. }
                    | Acquired::NoSession { .. }
                    | Acquired::NotSessionOwner { .. }) => {
                        return Err(format!("client {}: probe answered {refused:?}", client + 1))
                    }
                }
            }
            Op::Renew { key, token, lease_ms, release_at_ms } => match one_renewal(client, response)? {
                Renewal::Renewed { .. } => {
                    self.checker.durability.acked_renewal(&key, token);
                    self.checker.holders.renewed(client, &key, token, sent_ms, lease_ms.get());
                    self.checker.shared.renewed(client, &key, token, sent_ms, lease_ms.get())?;
                    // The state was reset when the answer came: the renewal
                    // carries when the holder lets go.
                    self.clients[client].state = ClientState::Holding { key, token, lease_ms, release_at_ms };
                    self.wake_client(client, (lease_ms.get() / 3).max(1));
                }
                Renewal::NotHeld { .. } => {
                    // The lock is gone: the client knows it lost it.
                    self.let_go(client);
                    self.wake_client(client, pause);
                }
                refused @ Renewal::NotYours { .. } => {
                    return Err(format!("client {}: renew answered {refused:?}", client + 1))
                }
            },
            Op::OpenSession { ttl_ms } => {
                let Opened { session, ttl_ms: opened_ms } = answer_of::<Opened>(client, response)?;
                if opened_ms != ttl_ms {
                    return Err(format!(
                        "client {}: session open for {} ms answered {session} for {} ms",
                        client + 1,
                        ttl_ms.get(),
                        opened_ms.get()
                    ));
                }
                self.checker.sessions.opened(client, session, sent_ms, ttl_ms.get());
                let plan = self.session_plan();
                let life_ms = self.rng.range(ttl_ms.get(), 6 * ttl_ms.get());
                let close = self.rng.chance(600_000);
                self.note(&format!("client {} opened session {session} for {} ms", client + 1, ttl_ms.get()));
                self.clients[client].session = Some(OpenSession {
                    id: session,
                    ttl_ms,
                    held: Vec::new(),
                    plan,
                    keep_alive_at_ms: self.now_ms + ttl_ms.get() / 3,
                    end_at_ms: self.now_ms + life_ms,
                    close,
                });
                self.wake_client(client, pause);
            }
            Op::KeepAlive { session } => match answer_of::<SessionKept>(client, response)? {
                SessionKept::Kept { ttl_ms } => {
                    self.session_kept_alive(client, session, sent_ms, ttl_ms)?;
                    self.wake_client(client, pause);
                }
                SessionKept::NotOpen => {
                    self.session_gone(client, session)?;
                    self.wake_client(client, pause);
                }
                SessionKept::NotYours => {
                    return Err(format!(
                        "client {}: keep-alive of {session} answered not its own",
                        client + 1
                    ))
                }
            },
            Op::RenewIn { key, token, session } => match one_renewal(client, response)? {
                Renewal::Renewed { token: renewed, lease_ms } if renewed == token => {
                    self.checker.durability.acked_renewal(&key, token);
                    self.session_kept_alive(client, session, sent_ms, lease_ms)?;
                    self.wake_client(client, pause);
                }
                Renewal::NotHeld { .. } => {
                    // Its session lapsed (the next keep-alive tells).
                    if let Some(open) =
                        self.clients[client].session.as_mut().filter(|open| open.id == session)
                    {
                        open.held.retain(|(held, of)| *held != key || *of != token);
                        open.keep_alive_at_ms = self.now_ms;
                    }
                    self.checker.sessions.released(&key, token);
                    self.wake_client(client, pause);
                }
                refused @ (Renewal::Renewed { .. } | Renewal::NotYours { .. }) => {
                    return Err(format!(
                        "client {}: renew of {key} under {session} answered {refused:?}",
                        client + 1
                    ))
                }
            },
            Op::AcquireIn { key, share, session, .. } => match answer_of::<Acquired>(client, response)? {
                Acquired::Granted { token, lease_ms, .. } => {
                    let Some(open) = self.clients[client].session.as_mut().filter(|open| open.id == session)
                    else {
                        return Err(format!(
                            "client {}: granted {key} under {session}, not its session",
                            client + 1
                        ));
                    };
                    open.held.push((key.clone(), token));
                    let ttl_ms = open.ttl_ms;
                    if lease_ms != ttl_ms {
                        return Err(format!(
                            "client {}: granted {key} ({token}) under session {session} of {} ms, with a lease of {} ms",
                            client + 1,
                            ttl_ms.get(),
                            lease_ms.get()
                        ));
                    }
                    self.grants += 1;
                    self.checker.durability.acked_grant(&key, token);
                    self.checker.sessions.granted_in(client, session, &key, token)?;
                    self.note(&format!(
                        "client {} granted {key} {token} under session {session}",
                        client + 1
                    ));
                    self.wake_client(client, pause);
                }
                // Its owner holds the key under another session (one it
                // abandoned, not lapsed yet): turned away by its own token,
                // decided at apply (the handler answers held).
                Acquired::Held { .. } => self.wake_client(client, pause),
                // The session is gone: a clean refusal.
                Acquired::NoSession { session: gone } if gone == session => {
                    self.session_gone(client, session)?;
                    self.wake_client(client, pause);
                }
                Acquired::Mismatch { permits } if share.is_some() => {
                    let share = share.expect("shared");
                    self.checker.shared.mismatched(client, share, Some(permits))?;
                    self.wake_client(client, pause);
                }
                refused @ (Acquired::NoSession { .. }
                | Acquired::Mismatch { .. }
                | Acquired::NotSessionOwner { .. }) => {
                    return Err(format!(
                        "client {}: acquire of {key} under {session} answered {refused:?}",
                        client + 1
                    ))
                }
            },
            // NotOpen: it lapsed first, or an earlier try closed it.
            Op::CloseSession { session } => match answer_of::<SessionClosed>(client, response)? {
                SessionClosed::Closed | SessionClosed::NotOpen => self.wake_client(client, pause),
                SessionClosed::NotYours => {
                    return Err(format!("client {}: close of {session} answered not its own", client + 1))
                }
            },
            Op::ReleaseIn { key, token } => {
                match answer_of::<Released>(client, response)? {
                    Released::Released { .. } => self.checker.durability.acked_release(&key, token),
                    Released::NotHeld { .. } => {}
                    refused @ Released::NotYours { .. } => {
                        return Err(format!("client {}: release answered {refused:?}", client + 1))
                    }
                }
                self.wake_client(client, pause);
            }
            Op::Release { key, token } => {
                match answer_of::<Released>(client, response)? {
                    Released::Released { .. } => self.checker.durability.acked_release(&key, token),
                    Released::NotHeld { .. } => {}
                    refused @ Released::NotYours { .. } => {
                        return Err(format!("client {}: release answered {refused:?}", client + 1))
                    }
                }
                if key == self.clients[client].final_key {
                    self.clients[client].served_after_heal = true;
                    self.checker.liveness.served(client);
                }
                self.wake_client(client, pause);
            }
            Op::Get { key } => {
                match answer_of::<Holding>(client, response)? {
                    // A shared key without holders reads as a free plain lock.
                    Holding::Plain(holder) if shared::is_shared(key.as_bytes()) => {
                        if let Some(held) = holder {
                            return Err(format!(
                                "client {}: a get of {key} answered a plain lock: {held:?}",
                                client + 1
                            ));
                        }
                        self.checker.shared.read(&key, &[], sent_ms, self.now_ms)?;
                    }
                    Holding::Shared(holders) => {
                        // A holder held back by lock-delay holds nothing.
                        let held = holders
                            .iter()
                            .filter(|held| !held.lock.delayed)
                            .map(|held| held.share.map(|share| (held.lock.token, share)))
                            .collect::<Option<Vec<_>>>()
                            .ok_or_else(|| {
                                format!("client {}: a get of {key} answered {holders:?}", client + 1)
                            })?;
                        self.checker.shared.read(&key, &held, sent_ms, self.now_ms)?;
                    }
                    Holding::Plain(holder) => {
                        // A lock held back by lock-delay has no holder.
                        let token = holder.filter(|held| !held.lock.delayed).map(|held| held.lock.token);
                        self.checker.reads.answered(&key, token, sent_ms, self.now_ms)?;
                    }
                }
                self.wake_client(client, pause);
            }
            Op::Check { key, token } => {
                let Checked(holds) = answer_of(client, response)?;
                self.checker.reads.checked(&key, token, holds, sent_ms, self.now_ms)?;
                self.wake_client(client, pause);
            }
            Op::List { prefix } => {
                let Listed(locks) = answer_of(client, response)?;
                // Judged key by key: each listed key's holder, and no holder
                // for the keys the list leaves out.
                if locks.iter().any(|(key, _)| !key.as_bytes().starts_with(&prefix)) {
                    return Err(format!("client {}: a list of {prefix:?} answered {locks:?}", client + 1));
                }
                for n in 0..KEYS {
                    let key = Key::new(format!("k{n}").into_bytes()).expect("a valid key");
                    if !key.as_bytes().starts_with(&prefix) {
                        continue;
                    }
                    let token = locks
                        .iter()
                        .find(|(listed, held)| *listed == key && !held.lock.delayed)
                        .map(|(_, held)| held.lock.token);
                    self.checker.reads.answered(&key, token, sent_ms, self.now_ms)?;
                }
                for name in [RW_KEY, SEMAPHORE_KEY].into_iter().filter(|name| name.starts_with(&prefix)) {
                    let key = Key::new(name.to_vec()).expect("a valid key");
                    let held = locks
                        .iter()
                        .filter(|(listed, held)| *listed == key && !held.lock.delayed)
                        .map(|(_, held)| held.share.map(|share| (held.lock.token, share)))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| {
                            format!("client {}: a list of {key} answered {locks:?}", client + 1)
                        })?;
                    self.checker.shared.read(&key, &held, sent_ms, self.now_ms)?;
                }
                self.wake_client(client, pause);
            }
            Op::Watch { prefix, after, .. } => {
                let answer = answer_of::<WatchAnswer>(client, response)?;
                self.checker.watches.answered(&prefix, after, &answer)?;
                self.clients[client].watch_at = Some(answer.index);
                self.wake_client(client, pause);
            }
        }
        Ok(())
    }

    /// `client`'s `op` was refused with `err`: it retries what may be
    /// retried, and takes a held key or a wait that ran out as an answer.
    fn client_refused(
        &mut self,
        client: usize,
        op: Op,
        sent_ms: u64,
        err: RequestError,
        pause: u64,
    ) -> Result<(), String> {
        match (op, err) {
            (op, RequestError::NotLeader { leader_hint }) => {
                self.clients[client].target = match leader_hint {
                    Some(leader) => (leader.0 - 1) as usize,
                    None => (self.clients[client].target + 1) % self.nodes.len(),
                };
                self.retry(client, op, pause);
            }
            (
                op,
                RequestError::LeadershipLost { .. }
                | RequestError::Dropped
                | RequestError::Overloaded
                | RequestError::Stopped,
            ) => self.retry(client, op, pause),
            (op, RequestError::LevelNotReached { needed, level, .. }) => {
                self.level_not_reached(client, op, needed, level, pause)?
            }
            (
                Op::Probe { key, share, token, lease_ms, release_at_ms },
                RequestError::Held { .. } | RequestError::WaitTimedOut { .. },
            ) => {
                // The key is held in the probe's kind: its lock is gone too,
                // as its next renewal will tell.
                self.checker.shared.probed(client, share, None, sent_ms, self.now_ms)?;
                self.clients[client].state = ClientState::Holding { key, token, lease_ms, release_at_ms };
                self.wake_client(client, pause);
            }
            (
                Op::Acquire { .. } | Op::AcquireShared { .. } | Op::AcquireIn { .. },
                RequestError::Held { .. } | RequestError::Delayed { .. } | RequestError::WaitTimedOut { .. },
            ) => self.wake_client(client, pause),
            (op, err) => return Err(format!("client {}: {op:?} answered {err:?}", client + 1)),
        }
        Ok(())
    }

    /// `client` was refused `op` because the cluster is at command level
    /// `level` and it needs `needed`: nothing was proposed, so nothing is
    /// held or promised; it asks again, without the value for a plain
    /// acquire. A request that needs no level above 1 is never refused so.
    fn level_not_reached(
        &mut self,
        client: usize,
        op: Op,
        needed: u32,
        level: u32,
        pause: u64,
    ) -> Result<(), String> {
        match op {
            Op::Acquire { key, lease_ms, wait_ms, value: true } => {
                let op = Op::Acquire { key, lease_ms, wait_ms, value: false };
                self.clients[client].state = ClientState::Retrying { op };
                self.wake_client(client, pause);
            }
            // A leader that has not applied the raise yet: it still holds
            // its key.
            Op::Probe { key, token, lease_ms, release_at_ms, .. } => {
                self.clients[client].state = ClientState::Holding { key, token, lease_ms, release_at_ms };
                self.wake_client(client, pause);
            }
            op @ (Op::AcquireShared { .. }
            | Op::OpenSession { .. }
            | Op::KeepAlive { .. }
            | Op::CloseSession { .. }
            | Op::AcquireIn { .. }) => {
                let later = self.rng.range(LEVEL_RETRY_MS.0, LEVEL_RETRY_MS.1);
                self.retry(client, op, later);
            }
            op => {
                return Err(format!(
                    "client {}: {op:?} refused as needing level {needed}, the cluster at {level}",
                    client + 1
                ))
            }
        }
        Ok(())
    }

    /// `client` was told its session is alive, with `ttl_ms`, for a request
    /// sent at `sent_ms`: its next keep-alive is due a third of it later.
    fn session_kept_alive(
        &mut self,
        client: usize,
        session: FencingToken,
        sent_ms: u64,
        ttl_ms: LeaseMs,
    ) -> Result<(), String> {
        let Some(open) = self.clients[client].session.as_mut().filter(|open| open.id == session) else {
            // It ended it meanwhile (a retried request's answer).
            return Ok(());
        };
        if ttl_ms != open.ttl_ms {
            return Err(format!(
                "client {}: session {session} of {} ms was renewed for {} ms",
                client + 1,
                open.ttl_ms.get(),
                ttl_ms.get()
            ));
        }
        open.keep_alive_at_ms = self.now_ms + ttl_ms.get() / 3;
        self.checker.sessions.kept_alive(client, session, sent_ms, ttl_ms.get())
    }

    /// `client` was told its session is not open (NoSession): what it held
    /// under it is gone; it opens another at its next wake.
    fn session_gone(&mut self, client: usize, session: FencingToken) -> Result<(), String> {
        self.checker.sessions.refused(client, session, self.now_ms)?;
        if self.clients[client].session.as_ref().is_some_and(|open| open.id == session) {
            self.note(&format!("client {} told session {session} is gone", client + 1));
            self.clients[client].session = None;
        }
        Ok(())
    }

    /// `client` was granted `key` under `token`: it holds it a while,
    /// renewing it every third of its lease.
    fn hold(&mut self, client: usize, key: Key, token: FencingToken, lease_ms: LeaseMs) {
        // The final key only proves service: hand it back at once.
        let hold_ms = if key == self.clients[client].final_key {
            self.rng.range(1, 50)
        } else {
            self.rng.range(50, 3 * lease_ms.get())
        };
        let release_at_ms = self.now_ms + hold_ms;
        self.clients[client].state = ClientState::Holding { key, token, lease_ms, release_at_ms };
        self.wake_client(client, (lease_ms.get() / 3).min(hold_ms));
    }

    /// Sends `op` again after `pause_ms`, keeping a held lock held meanwhile.
    fn retry(&mut self, client: usize, op: Op, pause_ms: u64) {
        self.clients[client].state = match op {
            Op::Acquire { .. }
            | Op::AcquireShared { .. }
            | Op::Get { .. }
            | Op::Check { .. }
            | Op::List { .. }
            | Op::Watch { .. }
            // A session client decides again: a new session, a keep-alive
            // if one is still due, the next acquire.
            | Op::OpenSession { .. }
            | Op::KeepAlive { .. }
            | Op::RenewIn { .. }
            | Op::AcquireIn { .. } => ClientState::Idle,
            op @ (Op::CloseSession { .. } | Op::ReleaseIn { .. }) => ClientState::Retrying { op },
            // It still holds its key: back to renewing it.
            Op::Probe { key, token, lease_ms, release_at_ms, .. } => {
                ClientState::Holding { key, token, lease_ms, release_at_ms }
            }
            // The renewal's answer was lost: release soon rather than hold on.
            Op::Renew { key, token, lease_ms, .. } => {
                ClientState::Holding { key, token, lease_ms, release_at_ms: self.now_ms }
            }
            Op::Release { key, token } => ClientState::Holding {
                key,
                token,
                lease_ms: LeaseMs::new(600).expect("a valid lease"),
                release_at_ms: 0,
            },
        };
        self.wake_client(client, pause_ms);
    }
}

/// The answer of `client`'s request in its operation's type: an answer of
/// another operation (which the node never gives) fails the run, here and
/// nowhere else.
fn answer_of<A: Answer>(client: usize, response: Response) -> Result<A, String> {
    A::take(response).map_err(|other| {
        format!(
            "client {}: answered {other:?}, not a {}",
            client + 1,
            std::any::type_name::<A>().rsplit("::").next().unwrap_or("reply")
        )
    })
}

/// The one renewal a renewal of one lock is answered with.
fn one_renewal(client: usize, response: Response) -> Result<Renewal, String> {
    match <[Renewal; 1]>::try_from(answer_of::<Vec<Renewal>>(client, response)?) {
        Ok([renewal]) => Ok(renewal),
        Err(renewals) => Err(format!("client {}: a renewal of one lock answered {renewals:?}", client + 1)),
    }
}
