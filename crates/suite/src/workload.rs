//! The workload: client threads that take a lock, write to the fenced store
//! with its token, and release it, over and over on a few keys.
//!
//! Each thread is its own client (its own `Client`, connections and owner),
//! as separate processes would be. Locks are taken with `acquire_raw`, so no
//! background renewer keeps a lease alive: a holder that pauses past its
//! lease loses the lock, which is the point. Some holders overstay on their
//! own (a small, seeded share of their locks), and the pause-holder nemesis
//! asks a chosen client to overstay its next lock. An overstaying holder
//! checks its lock first, as a careful client does, then pauses, then
//! writes with a token that may be stale by then: the fenced store must
//! turn it away if a newer holder wrote meanwhile.
//!
//! While the reset-clients nemesis is on, every client first sends each
//! acquire to the leader on a connection of its own and hangs up before the
//! answer ([`HangUp`]), then retries the same acquire (same owner, key,
//! lease and wait) through its `Client`, on another connection, as
//! docs/protocol.md tells a client to. The abandoned acquire is recorded as
//! unanswered and the retry's answer as the client's grant. A lock got so
//! is then held for a while, as a client doing work under it would, so that
//! a lock taken from under its holder shows in the history.
//!
//! One of the keys is an election (`suite/election`): its acquires carry
//! the candidate's value, its holders proclaim a new value before they
//! write (a proclaim applied is evidence that the token held the key), and
//! an observer thread follows its leaders, which must come in log order.
//!
//! Two keys are shared: a read-write lock (`suite/rw`: three of four
//! acquires read, one writes; only the writer writes to the fenced store)
//! and a semaphore of two permits (`suite/pool`). Their holders hold for a
//! moment, so that holders meet, then release; they check, overstay and
//! pause like the others, and their acquires are abandoned and retried
//! under reset-clients like the others.
//!
//! Session clients (`session_clients`) open a session, take two of the
//! plain keys under it (contending with the other clients), write to the
//! fenced store under each token while one keep-alive every third of the
//! TTL keeps both, then close the session, or abandon it: they stop
//! keeping it alive, wait past its TTL, write with their stale tokens
//! (the store must turn them away once a newer holder wrote) and see an
//! acquire under the dead session refused. A lock under a session is
//! recorded with the time its session had left when the acquire was sent
//! (from the send of the open or of the last keep-alive answered alive) as
//! its lease: the least the cluster promised it; a close is recorded as a
//! release of each lock it held.
//!
//! Every loop is bounded: a thread starts no operation after the run's
//! deadline, and every call is bounded by the client's retry budget.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fencelock_client::{Client, ClientError, Share};
use fencelock_types::client_pb::{self, AcquireRequest};

use crate::hangup::HangUp;
use crate::history::{Op, OpKind, Outcome, Recorder, ShareKind};
use crate::nemesis::ClientFaults;
use crate::rng::SplitMix64;
use crate::store::FencedStore;

/// What the clients do.
#[derive(Clone, Debug)]
pub struct WorkloadConfig {
    pub clients: usize,
    pub keys: Vec<String>,
    /// Leases are drawn from this range (ms); the server's floor is 1,000.
    pub lease_ms: (u64, u64),
    /// Half of the acquires wait in the leader's queue, for a time drawn
    /// from this range (ms); the others answer at once.
    pub wait_ms: (u64, u64),
    /// The share of locks whose holder overstays on its own.
    pub overstay_chance: f64,
    /// How far past the lease an overstaying holder pauses (ms).
    pub overstay_extra_ms: (u64, u64),
    /// The share of holders that check their lock before writing.
    pub check_chance: f64,
    /// How long a client holds a lock whose acquire it hung up on and
    /// retried, before it writes (ms).
    pub reset_hold_ms: (u64, u64),
    pub request_timeout: Duration,
    pub retry_for: Duration,
    /// One of `keys` is an election: its acquires are campaigns with the
    /// client's value, and its holders proclaim a new value before they
    /// write. An observer thread follows it.
    pub election_key: Option<String>,
    /// One of `keys` is a read-write lock.
    pub rw_key: Option<String>,
    /// One of `keys` is a semaphore of this many permits.
    pub pool: Option<(String, u32)>,
    /// How long a shared holder holds before it releases (ms).
    pub shared_hold_ms: (u64, u64),
    /// Clients that hold two plain keys under one session at a time.
    pub session_clients: usize,
    /// Session TTLs are drawn from this range (ms).
    pub session_ttl_ms: (u64, u64),
}

impl WorkloadConfig {
    pub fn new(nodes: u64) -> WorkloadConfig {
        WorkloadConfig {
            clients: usize::try_from(2 * nodes + 2).unwrap_or(8),
            keys: (0..3)
                .map(|i| format!("suite/key-{i}"))
                .chain(["suite/election", "suite/rw", "suite/pool"].map(str::to_owned))
                .collect(),
            lease_ms: (1_000, 2_000),
            wait_ms: (100, 800),
            overstay_chance: 0.01,
            overstay_extra_ms: (300, 1_500),
            check_chance: 0.2,
            reset_hold_ms: (100, 400),
            request_timeout: Duration::from_millis(1_000),
            retry_for: Duration::from_secs(3),
            election_key: Some("suite/election".to_owned()),
            rw_key: Some("suite/rw".to_owned()),
            pool: Some(("suite/pool".to_owned(), 2)),
            shared_hold_ms: (20, 150),
            session_clients: 1,
            session_ttl_ms: (1_500, 3_000),
        }
    }
}

/// What the client threads share with the suite.
#[derive(Debug)]
pub struct Shared {
    pub recorder: Recorder,
    pub store: FencedStore,
    pub faults: ClientFaults,
    /// Holders overstaying on their own right now: at most one per two
    /// keys, so that the keys are not blocked all the time.
    overstaying: AtomicUsize,
}

impl Shared {
    pub fn new(start: Instant, clients: usize) -> Shared {
        Shared {
            recorder: Recorder::new(start),
            store: FencedStore::default(),
            faults: ClientFaults::new(clients),
            overstaying: AtomicUsize::new(0),
        }
    }
}

/// The owner identity of client `index`.
pub fn owner_of(index: usize) -> String {
    crate::tls::owner(&format!("suite-client-{index}"))
}

/// Starts the client threads; each stops by itself at `deadline`.
pub fn spawn(
    config: &WorkloadConfig,
    endpoints: &[String],
    shared: &Arc<Shared>,
    deadline: Instant,
    rng: &mut SplitMix64,
) -> Result<Vec<JoinHandle<()>>> {
    let mut threads = Vec::new();
    for index in 0..config.clients {
        let owner = owner_of(index);
        let mut client_config = crate::tls::client_config(endpoints.iter().cloned());
        client_config.request_timeout = config.request_timeout;
        client_config.retry_for = config.retry_for;
        client_config.owner = Some(owner.clone().into_bytes());
        let worker = Worker {
            index,
            owner,
            client: Client::connect(client_config)?,
            hang_up: HangUp::new(endpoints, config.request_timeout),
            config: config.clone(),
            shared: Arc::clone(shared),
            rng: rng.fork(),
            deadline,
        };
        let thread = std::thread::Builder::new()
            .name(format!("client-{index}"))
            .spawn(move || worker.run())
            .context("cannot start a client thread")?;
        threads.push(thread);
    }
    if let Some(election) = &config.election_key {
        let mut client_config = crate::tls::client_config(endpoints.iter().cloned());
        client_config.request_timeout = config.request_timeout;
        client_config.retry_for = config.retry_for;
        let observer = Observer {
            index: config.clients,
            key: election.clone(),
            client: Client::connect(client_config)?,
            shared: Arc::clone(shared),
            deadline,
        };
        let thread = std::thread::Builder::new()
            .name("observer".into())
            .spawn(move || observer.run())
            .context("cannot start the observer thread")?;
        threads.push(thread);
    }
    // The plain keys, which the session clients contend for with the others.
    let plain: Vec<String> = config
        .keys
        .iter()
        .filter(|key| {
            Some(key.as_str()) != config.election_key.as_deref()
                && Some(key.as_str()) != config.rw_key.as_deref()
                && config.pool.as_ref().is_none_or(|(pool, _)| pool != *key)
        })
        .cloned()
        .collect();
    for n in 0..config.session_clients {
        // After the workers and the observer in the history.
        let index = config.clients + 1 + n;
        let owner = owner_of(index);
        let mut client_config = crate::tls::client_config(endpoints.iter().cloned());
        client_config.request_timeout = config.request_timeout;
        client_config.retry_for = config.retry_for;
        client_config.owner = Some(owner.clone().into_bytes());
        let worker = SessionWorker {
            index,
            owner,
            client: Client::connect(client_config)?,
            keys: plain.clone(),
            config: config.clone(),
            shared: Arc::clone(shared),
            rng: rng.fork(),
            deadline,
        };
        let thread = std::thread::Builder::new()
            .name(format!("session-client-{n}"))
            .spawn(move || worker.run())
            .context("cannot start a session client thread")?;
        threads.push(thread);
    }
    Ok(threads)
}

/// Records client `client`'s operation on `key`, completed now.
fn record(
    shared: &Shared,
    client: usize,
    owner: &str,
    key: &str,
    invoke_us: u64,
    kind: OpKind,
    outcome: Outcome,
) {
    shared.recorder.record(Op {
        id: 0,
        client,
        owner: owner.to_owned(),
        key: key.to_owned(),
        invoke_us,
        complete_us: shared.recorder.now_us(),
        kind,
        outcome,
    });
}

/// Client `client` writes to the fenced store under `token`, and records it.
fn fenced_write(shared: &Shared, client: usize, owner: &str, key: &str, token: u64) {
    let invoke = shared.recorder.now_us();
    let outcome = match shared.store.write(key, token, client, invoke) {
        Ok(()) => Outcome::Accepted,
        Err(highest) => Outcome::Rejected { highest },
    };
    record(shared, client, owner, key, invoke, OpKind::Write { token }, outcome);
}

/// The history's record of a shared acquire.
fn shared_kind(share: Share, lease_ms: u64, wait_ms: u64) -> OpKind {
    let (share, permits) = match share {
        Share::Read => (ShareKind::Read, 0),
        Share::Write => (ShareKind::Write, 0),
        Share::Permit(permits) => (ShareKind::Permit, permits),
    };
    OpKind::AcquireShared { lease_ms, wait_ms, share, permits }
}

/// Follows the election key and records every change of leader it is told.
struct Observer {
    /// Its client number in the history: after the workers'.
    index: usize,
    key: String,
    client: Client,
    shared: Arc<Shared>,
    deadline: Instant,
}

impl Observer {
    fn run(self) {
        let mut observer = self.client.observe(&self.key);
        while Instant::now() < self.deadline {
            let invoke_us = self.shared.recorder.now_us();
            let outcome = match observer.next(Duration::from_millis(500)) {
                Ok(Some(change)) => {
                    Outcome::Observed { token: change.leader.map(|leader| leader.token), index: change.index }
                }
                Ok(None) => continue,
                Err(error) => {
                    std::thread::sleep(Duration::from_millis(100));
                    Outcome::Unknown { error: error.to_string() }
                }
            };
            self.shared.recorder.record(Op {
                id: 0,
                client: self.index,
                owner: "observer".to_owned(),
                key: self.key.clone(),
                invoke_us,
                complete_us: self.shared.recorder.now_us(),
                kind: OpKind::Observe,
                outcome,
            });
        }
    }
}

struct Worker {
    index: usize,
    owner: String,
    client: Client,
    hang_up: HangUp,
    config: WorkloadConfig,
    shared: Arc<Shared>,
    rng: SplitMix64,
    deadline: Instant,
}

impl Worker {
    fn run(mut self) {
        while Instant::now() < self.deadline {
            self.cycle();
        }
    }

    fn record(&self, key: &str, invoke_us: u64, kind: OpKind, outcome: Outcome) {
        record(&self.shared, self.index, &self.owner, key, invoke_us, kind, outcome);
    }

    /// One acquire, and if granted: maybe a check and a pause, the write,
    /// and the release.
    fn cycle(&mut self) {
        let Some(key) = self.rng.pick(&self.config.keys).cloned() else { return };
        let lease_ms = self.rng.between(self.config.lease_ms.0, self.config.lease_ms.1);
        let wait_ms = if self.rng.chance(0.5) {
            0
        } else {
            self.rng.between(self.config.wait_ms.0, self.config.wait_ms.1)
        };
        let election = self.config.election_key.as_deref() == Some(key.as_str());
        let share = self.share_for(&key);
        let reset = self.shared.faults.resets.is_on() && self.abandon(&key, lease_ms, wait_ms, share);
        let invoke = self.shared.recorder.now_us();
        // A campaign names its candidate (a retried one keeps the value).
        let value = if election { format!("candidate-{}", self.index) } else { String::new() };
        let (lease, wait) = (Duration::from_millis(lease_ms), Duration::from_millis(wait_ms));
        let (answer, kind) = match share {
            Some(share) => (
                self.client.acquire_shared_raw(self.owner.as_bytes(), &key, share, lease, wait),
                shared_kind(share, lease_ms, wait_ms),
            ),
            None => (
                self.client.acquire_raw_with_value(
                    self.owner.as_bytes(),
                    &key,
                    value.as_bytes(),
                    lease,
                    wait,
                ),
                OpKind::Acquire { lease_ms, wait_ms },
            ),
        };
        let grant = match answer {
            Ok(grant) => {
                let granted_ms = u64::try_from(grant.lease.as_millis()).unwrap_or(u64::MAX);
                self.record(
                    &key,
                    invoke,
                    kind,
                    Outcome::Granted { token: grant.token, lease_ms: granted_ms, existing: grant.existing },
                );
                grant
            }
            Err(error) => {
                self.record(&key, invoke, kind, Outcome::from_error(&error));
                // Think time before the next try, so that turned-away
                // clients do not spin on a held key.
                let pause = match error {
                    ClientError::Held { .. } => self.rng.between(10, 50),
                    ClientError::WaitTimedOut { .. } => 0,
                    _ => self.rng.between(20, 100),
                };
                std::thread::sleep(Duration::from_millis(pause));
                return;
            }
        };
        let token = grant.token;
        // Shared holders hold a moment, so that holders meet.
        if share.is_some() {
            let hold_ms = self.rng.between(self.config.shared_hold_ms.0, self.config.shared_hold_ms.1);
            std::thread::sleep(Duration::from_millis(hold_ms));
        }
        if reset {
            // The work the lock protects, which takes a while.
            let hold_ms = self.rng.between(self.config.reset_hold_ms.0, self.config.reset_hold_ms.1);
            std::thread::sleep(Duration::from_millis(hold_ms));
        }

        let asked = self.shared.faults.pauses.take(self.index);
        let on_its_own =
            asked.is_none() && self.rng.chance(self.config.overstay_chance) && self.claim_overstay();
        let extra_ms = match asked {
            Some(extra) => Some(extra),
            None if on_its_own => {
                Some(self.rng.between(self.config.overstay_extra_ms.0, self.config.overstay_extra_ms.1))
            }
            None => None,
        };
        if extra_ms.is_some() || self.rng.chance(self.config.check_chance) {
            let invoke = self.shared.recorder.now_us();
            let outcome = match self.client.check(&key, token) {
                Ok(true) => Outcome::Holds,
                Ok(false) => Outcome::DoesNotHold,
                Err(error) => Outcome::from_error(&error),
            };
            self.record(&key, invoke, OpKind::Check { token }, outcome);
        }
        if let Some(extra_ms) = extra_ms {
            // The GC pause: the holder stops, nothing renews its lease.
            let ms = u64::try_from(grant.lease.as_millis()).unwrap_or(u64::MAX).saturating_add(extra_ms);
            let invoke = self.shared.recorder.now_us();
            std::thread::sleep(Duration::from_millis(ms));
            self.record(&key, invoke, OpKind::Pause { token, ms }, Outcome::Paused);
        }

        if election {
            // The leader says where it serves now, before it writes.
            let invoke = self.shared.recorder.now_us();
            let value = format!("candidate-{} serving", self.index);
            let outcome = match self.client.proclaim(&key, token, value.as_bytes()) {
                Ok(done) if done.released => Outcome::Proclaimed,
                Ok(_) => Outcome::NotHeld,
                Err(error) => Outcome::from_error(&error),
            };
            self.record(&key, invoke, OpKind::Proclaim { token }, outcome);
        }

        // Readers and permit holders share the key: only a plain holder
        // or a writer may write, for the store's rule is one writer's.
        if matches!(share, None | Some(Share::Write)) {
            fenced_write(&self.shared, self.index, &self.owner, &key, token);
        }

        let invoke = self.shared.recorder.now_us();
        let outcome = match self.client.release(&key, token) {
            Ok(true) => Outcome::Released,
            Ok(false) => Outcome::NotHeld,
            Err(error) => Outcome::from_error(&error),
        };
        self.record(&key, invoke, OpKind::Release { token }, outcome);
        if on_its_own {
            self.shared.overstaying.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Sends the acquire and hangs up before its answer; true when it went
    /// out (and is recorded as unanswered), false when nothing was sent.
    fn abandon(&mut self, key: &str, lease_ms: u64, wait_ms: u64, share: Option<Share>) -> bool {
        let (share_pb, permits) = match share {
            None => (client_pb::Share::EXCLUSIVE, 0),
            Some(Share::Read) => (client_pb::Share::READ, 0),
            Some(Share::Write) => (client_pb::Share::WRITE, 0),
            Some(Share::Permit(permits)) => (client_pb::Share::PERMIT, permits),
        };
        let request = AcquireRequest {
            key: key.as_bytes().to_vec(),
            lease_ms,
            owner: self.owner.as_bytes().to_vec(),
            wait_ms,
            share: share_pb,
            permits,
            ..Default::default()
        };
        let invoke = self.shared.recorder.now_us();
        if self.hang_up.acquire(&self.client, request).is_err() {
            return false;
        }
        self.shared.faults.resets.abandoned();
        let error = "hung up before the answer (reset-clients)".to_owned();
        let kind = match share {
            Some(share) => shared_kind(share, lease_ms, wait_ms),
            None => OpKind::Acquire { lease_ms, wait_ms },
        };
        self.record(key, invoke, kind, Outcome::Unknown { error });
        true
    }

    /// How this cycle holds `key`: alone, or, on the shared keys, as a
    /// reader (three times in four) or the writer, or as a permit.
    fn share_for(&mut self, key: &str) -> Option<Share> {
        if self.config.rw_key.as_deref() == Some(key) {
            return Some(if self.rng.chance(0.75) { Share::Read } else { Share::Write });
        }
        match &self.config.pool {
            Some((pool, permits)) if pool == key => Some(Share::Permit(*permits)),
            _ => None,
        }
    }

    /// Takes one of the few overstay slots, if one is free.
    fn claim_overstay(&self) -> bool {
        let limit = (self.config.keys.len() / 2).max(1);
        self.shared
            .overstaying
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| (now < limit).then_some(now + 1))
            .is_ok()
    }
}

/// A client that holds two plain keys under one session at a time (see the
/// module docs).
struct SessionWorker {
    index: usize,
    owner: String,
    client: Client,
    keys: Vec<String>,
    config: WorkloadConfig,
    shared: Arc<Shared>,
    rng: SplitMix64,
    deadline: Instant,
}

impl SessionWorker {
    fn run(mut self) {
        while Instant::now() < self.deadline {
            self.cycle();
        }
    }

    fn record(&self, key: &str, invoke_us: u64, kind: OpKind, outcome: Outcome) {
        record(&self.shared, self.index, &self.owner, key, invoke_us, kind, outcome);
    }

    /// Writes to the fenced store under `token`.
    fn write(&self, key: &str, token: u64) {
        fenced_write(&self.shared, self.index, &self.owner, key, token);
    }

    /// Opens a session, takes keys under it, writes under each token while
    /// keeping it alive, then closes or abandons it.
    fn cycle(&mut self) {
        let ttl_ms = self.rng.between(self.config.session_ttl_ms.0, self.config.session_ttl_ms.1);
        let ttl_us = ttl_ms.saturating_mul(1_000);
        let invoke = self.shared.recorder.now_us();
        let session = match self.client.open_session_as(self.owner.as_bytes(), Duration::from_millis(ttl_ms))
        {
            Ok(session) => {
                let outcome = Outcome::SessionOpened { session: session.id };
                self.record("", invoke, OpKind::SessionOpen { ttl_ms }, outcome);
                session.id
            }
            Err(error) => {
                self.record("", invoke, OpKind::SessionOpen { ttl_ms }, Outcome::from_error(&error));
                std::thread::sleep(Duration::from_millis(self.rng.between(50, 200)));
                return;
            }
        };
        // The session lives at least until this, counted from a send.
        let mut alive_until_us = invoke.saturating_add(ttl_us);
        let mut held: Vec<(String, u64)> = Vec::new();
        let mut keys = self.keys.clone();
        for _ in 0..2 {
            let Some(key) = self.rng.pick(&keys).cloned() else { break };
            keys.retain(|other| *other != key);
            let wait_ms = if self.rng.chance(0.5) { 0 } else { self.rng.between(100, 500) };
            let invoke = self.shared.recorder.now_us();
            // What the session has left when the acquire is sent: the least
            // the lock is promised.
            let lease_ms = alive_until_us.saturating_sub(invoke) / 1_000;
            if lease_ms == 0 {
                break;
            }
            let kind = OpKind::Acquire { lease_ms, wait_ms };
            let answer = self.client.acquire_raw_in(
                session,
                self.owner.as_bytes(),
                &key,
                Duration::from_millis(wait_ms),
            );
            match answer {
                Ok(grant) => {
                    let outcome = Outcome::Granted { token: grant.token, lease_ms, existing: grant.existing };
                    self.record(&key, invoke, kind, outcome);
                    held.push((key, grant.token));
                }
                Err(error) => self.record(&key, invoke, kind, Outcome::from_error(&error)),
            }
        }
        // Hold: a few rounds of writes, each after a keep-alive.
        let rounds = self.rng.between(1, 4);
        for _ in 0..rounds {
            if Instant::now() >= self.deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(ttl_ms / 3));
            let invoke = self.shared.recorder.now_us();
            let outcome = match self.client.keep_alive(session) {
                Ok(true) => {
                    alive_until_us = alive_until_us.max(invoke.saturating_add(ttl_us));
                    Outcome::SessionFound
                }
                Ok(false) => Outcome::SessionGone,
                Err(error) => Outcome::from_error(&error),
            };
            let gone = outcome == Outcome::SessionGone;
            self.record("", invoke, OpKind::KeepAlive { session }, outcome);
            if gone {
                break;
            }
            for (key, token) in &held {
                self.write(key, *token);
            }
        }
        if self.rng.chance(0.6) {
            let invoke = self.shared.recorder.now_us();
            let outcome = match self.client.close_session(session) {
                Ok(true) => Outcome::SessionFound,
                Ok(false) => Outcome::SessionGone,
                Err(error) => Outcome::from_error(&error),
            };
            // The close released each lock it held, as far as its answer
            // tells.
            let released = match &outcome {
                Outcome::SessionFound => Outcome::Released,
                Outcome::SessionGone => Outcome::NotHeld,
                other => other.clone(),
            };
            self.record("", invoke, OpKind::SessionClose { session }, outcome);
            for (key, token) in &held {
                self.record(key, invoke, OpKind::Release { token: *token }, released.clone());
            }
            return;
        }
        // Abandoned: no keep-alive past its TTL. Then the holder writes
        // with its stale tokens (the store turns them away once a newer
        // holder wrote), and an acquire under the dead session is refused.
        let lapse_ms = alive_until_us.saturating_sub(self.shared.recorder.now_us()) / 1_000;
        std::thread::sleep(Duration::from_millis(lapse_ms + self.rng.between(200, 800)));
        for (key, token) in &held {
            self.write(key, *token);
        }
        if let Some(key) = self.keys.first().cloned() {
            let invoke = self.shared.recorder.now_us();
            let kind = OpKind::Acquire { lease_ms: 0, wait_ms: 0 };
            let outcome =
                match self.client.acquire_raw_in(session, self.owner.as_bytes(), &key, Duration::ZERO) {
                    Ok(grant) => {
                        Outcome::Granted { token: grant.token, lease_ms: 0, existing: grant.existing }
                    }
                    Err(error) => Outcome::from_error(&error),
                };
            self.record(&key, invoke, kind, outcome);
        }
    }
}
