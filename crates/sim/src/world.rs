//! One simulated cluster: real replicas on simulated disks, a simulated
//! network and clocks, clients, and the fault schedule, all driven by one
//! event queue in simulated time from one seed.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_raft::rejoin::{self, Membership, PeerReport, Start};
use fencelock_raft::{
    Config, Durable as _, NodeId, Replica, Reply, RequestError, RequestId, Response, Role, WriteBatch,
};
use fencelock_types::{ApplyResult, Command, FencingToken, Key, LeaseMs, Owner};
use raft::prelude::Message;

use crate::disk::SimDisk;
use crate::invariants::{convergence, Checker};
use crate::rng::Rng;
use crate::{Report, SimConfig, Violation};

/// The length of a raft tick on each node's own clock.
const TICK_MS: u64 = 10;
/// The window election timeouts are drawn from, in ticks.
const ELECTION_TICKS_MIN: usize = 10;
const ELECTION_TICKS_MAX: usize = 20;
/// How long a client waits for an answer before it gives the request up.
const REQUEST_TIMEOUT_MS: u64 = 3_000;
/// After the heal, how long before clients must be served again.
const HEAL_SETTLE_MS: u64 = 1_000;
/// After the run, how long the nodes get to agree on one table.
const QUIESCE_MS: u64 = 10_000;

/// The fault mix of one run, drawn from its seed (swarm testing).
#[derive(Clone, Debug)]
pub struct Swarm {
    pub loss_ppm: u64,
    pub duplicate_ppm: u64,
    pub delay_min_ms: u64,
    pub delay_jitter_ms: u64,
    pub fault_interval_ms: u64,
    /// Relative weights of partition, crash, pause and clock jump.
    pub weights: [u64; 4],
    /// Crashes strike between writes of a turn, not only between turns.
    pub crash_mid_turn: bool,
    /// Clients abandoning an acquire before its answer (a disconnect).
    pub abandon_ppm: u64,
    /// Clock drift bound, in parts per million, for each node.
    pub drift_ppm_max: u64,
    /// Crashes that also lose the node's disk, which then starts blank and
    /// rejoins (`fencelock_raft::rejoin`), one node at a time.
    pub lose_disk_ppm: u64,
}

impl Swarm {
    fn draw(rng: &mut Rng) -> Swarm {
        Swarm {
            loss_ppm: rng.pick(&[0, 1_000, 20_000, 100_000]),
            duplicate_ppm: rng.pick(&[0, 10_000, 50_000]),
            delay_min_ms: rng.pick(&[0, 1, 5]),
            delay_jitter_ms: rng.pick(&[1, 10, 40]),
            fault_interval_ms: rng.pick(&[300, 1_000, 3_000]),
            weights: [rng.range(0, 4), rng.range(0, 4), rng.range(0, 4), rng.range(0, 3)],
            crash_mid_turn: rng.chance(500_000),
            abandon_ppm: rng.pick(&[0, 20_000, 100_000]),
            drift_ppm_max: rng.pick(&[0, 1_000, 50_000, 500_000]),
            lose_disk_ppm: rng.pick(&[0, 0, 300_000]),
        }
    }
}

#[derive(Debug)]
enum Event {
    Deliver {
        to: usize,
        message: Box<Message>,
    },
    Tick(usize),
    /// Run another turn: the last one left work behind.
    Poke(usize),
    /// An asynchronous disk's fsync completes: what was queued is durable.
    Persist(usize),
    /// A client's timer; only its latest one counts.
    Client {
        client: usize,
        generation: u64,
    },
    Fault,
    Restart(usize),
    ClearPartition(u64),
    Heal,
    Finish,
}

struct Node {
    replica: Option<Replica<SimDisk>>,
    disk: SimDisk,
    config: Config,
    /// Where this node's clock starts: clocks need not agree.
    skew_ms: u64,
    drift_ppm: i64,
    jump_ms: u64,
    paused_until_ms: u64,
    tick_scheduled: bool,
    persist_scheduled: bool,
    /// Up with a blank disk, waiting for its peers before it takes part:
    /// it answers their questions as a blank node.
    probing: bool,
    /// Lost its disk and has not caught up since.
    recovering: bool,
}

impl Node {
    /// This node's monotonic clock at true time `now_ms`.
    fn local_ms(&self, now_ms: u64) -> u64 {
        let scaled = i128::from(now_ms) * i128::from(1_000_000 + self.drift_ppm) / 1_000_000;
        self.skew_ms + scaled as u64 + self.jump_ms
    }

    /// True milliseconds between two of this node's ticks.
    fn tick_every_ms(&self) -> u64 {
        (TICK_MS as i128 * 1_000_000 / i128::from(1_000_000 + self.drift_ppm)).max(1) as u64
    }
}

#[derive(Clone, Debug)]
enum Op {
    Acquire { key: Key, lease_ms: LeaseMs, wait_ms: u64 },
    Renew { key: Key, token: FencingToken, lease_ms: LeaseMs },
    Release { key: Key, token: FencingToken },
}

#[derive(Debug)]
enum ClientState {
    Idle,
    Waiting { id: RequestId, op: Op, deadline_ms: u64 },
    Holding { key: Key, token: FencingToken, lease_ms: LeaseMs, release_at_ms: u64 },
}

struct Client {
    /// Bumped whenever the client's timer is set, so that earlier timers
    /// are ignored.
    generation: u64,
    owner: Owner,
    target: usize,
    state: ClientState,
    /// The key this client must get and release after the heal.
    final_key: Key,
    served_after_heal: bool,
}

pub struct World {
    config: SimConfig,
    pub swarm: Swarm,
    rng: Rng,
    now_ms: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Event>,
    nodes: Vec<Node>,
    clients: Vec<Client>,
    /// Directed links whose messages are dropped, by partition id.
    cut: BTreeMap<u64, BTreeSet<(usize, usize)>>,
    /// Print each note of the trace as it is made (`SIM_TRACE=1`).
    print_notes: bool,
    next_partition: u64,
    /// Client requests in flight: id → client.
    requests: BTreeMap<RequestId, usize>,
    /// Requests whose client gave up: a grant they get is a ghost.
    abandoned: BTreeMap<RequestId, Op>,
    next_request: u64,
    healed: bool,
    finished: bool,
    checker: Checker,
    trace: crc32fast::Hasher,
    events: u64,
    grants: u64,
    faults: u64,
}

impl World {
    pub fn new(config: SimConfig) -> World {
        let mut rng = Rng::new(config.seed);
        let swarm = Swarm::draw(&mut rng);
        let voters: Vec<NodeId> = (1..=config.nodes as u64).map(NodeId).collect();
        let nodes = (0..config.nodes)
            .map(|i| {
                let mut driver = Config::new(NodeId(i as u64 + 1), voters.clone());
                // raft-rs draws election timeouts from an unseeded generator;
                // the world draws them from the seed instead, after every
                // role or term change (`pin_election_timeout`).
                driver.election_ticks = ELECTION_TICKS_MIN;
                driver.election_ticks_max = Some(ELECTION_TICKS_MAX);
                driver.heartbeat_ticks = 2;
                driver.snapshot_interval_entries = rng.pick(&[20, 100, 1_000]);
                driver.lease_ms_min = 500;
                driver.lease_ms_max = 60_000;
                driver.expiry_scan_interval_ms = 10;
                let drift_bound = swarm.drift_ppm_max as i64;
                let drift_ppm = rng.range(0, 2 * drift_bound as u64 + 1) as i64 - drift_bound;
                let asynchronous = rng.chance(500_000);
                Node {
                    replica: None,
                    disk: SimDisk::new(asynchronous),
                    config: driver,
                    skew_ms: rng.range(0, 1_000_000),
                    drift_ppm,
                    jump_ms: 0,
                    paused_until_ms: 0,
                    tick_scheduled: false,
                    persist_scheduled: false,
                    probing: false,
                    recovering: false,
                }
            })
            .collect();
        let clients = (0..config.clients)
            .map(|i| Client {
                generation: 0,
                owner: Owner::new(format!("client-{}", i + 1).into_bytes()).expect("a valid owner"),
                target: i % config.nodes,
                state: ClientState::Idle,
                final_key: Key::new(format!("final/{}", i + 1).into_bytes()).expect("a valid key"),
                served_after_heal: false,
            })
            .collect();
        let checker = Checker::new(config.nodes);
        World {
            config,
            swarm,
            rng,
            now_ms: 0,
            seq: 0,
            queue: BTreeMap::new(),
            nodes,
            clients,
            cut: BTreeMap::new(),
            print_notes: std::env::var_os("SIM_TRACE").is_some(),
            next_partition: 0,
            requests: BTreeMap::new(),
            abandoned: BTreeMap::new(),
            next_request: 0,
            healed: false,
            finished: false,
            checker,
            trace: crc32fast::Hasher::new(),
            events: 0,
            grants: 0,
            faults: 0,
        }
    }

    pub fn run(mut self) -> Report {
        let result = self.simulate();
        Report {
            seed: self.config.seed,
            nodes: self.config.nodes,
            sim_ms: self.now_ms,
            events: self.events,
            grants: self.grants,
            faults: self.faults,
            acknowledgements: self.checker.durability.acknowledgements(),
            trace_digest: self.trace.clone().finalize(),
            swarm: format!("{:?}", self.swarm),
            result,
        }
    }

    fn simulate(&mut self) -> Result<(), Violation> {
        for node in 0..self.nodes.len() {
            self.start_node(node).map_err(|message| self.violation(message))?;
        }
        for client in 0..self.clients.len() {
            let at = self.rng.range(0, 500);
            self.wake(client, at);
        }
        self.schedule(self.swarm.fault_interval_ms, Event::Fault);
        self.schedule(self.config.fault_ms, Event::Heal);
        let end_ms = self.config.fault_ms + self.config.heal_ms;
        self.schedule(end_ms, Event::Finish);

        while let Some(((at, _), event)) = self.queue.pop_first() {
            self.now_ms = at;
            self.events += 1;
            self.handle(event).map_err(|message| self.violation(message))?;
            if self.finished {
                break;
            }
        }
        self.finish().map_err(|message| self.violation(message))
    }

    fn violation(&self, message: String) -> Violation {
        Violation { at_ms: self.now_ms, message }
    }

    fn schedule(&mut self, delay_ms: u64, event: Event) {
        self.seq += 1;
        self.queue.insert((self.now_ms + delay_ms, self.seq), event);
    }

    fn note(&mut self, line: &str) {
        let line = format!("{} {line}\n", self.now_ms);
        self.trace.update(line.as_bytes());
        if self.print_notes {
            eprint!("{line}");
        }
    }

    fn handle(&mut self, event: Event) -> Result<(), String> {
        match event {
            Event::Deliver { to, message } => {
                if let Some(delay) = self.paused(to) {
                    self.schedule(delay, Event::Deliver { to, message });
                    return Ok(());
                }
                let Some(replica) = self.nodes[to].replica.as_mut() else { return Ok(()) };
                replica.step(*message);
                self.turn(to)
            }
            Event::Tick(node) => {
                self.nodes[node].tick_scheduled = false;
                if self.nodes[node].replica.is_none() {
                    return Ok(());
                }
                if let Some(delay) = self.paused(node) {
                    self.nodes[node].tick_scheduled = true;
                    self.schedule(delay, Event::Tick(node));
                    return Ok(());
                }
                if let Some(replica) = self.nodes[node].replica.as_mut() {
                    replica.tick();
                }
                self.schedule_tick(node);
                self.turn(node)
            }
            Event::Poke(node) => {
                if self.paused(node).is_some() || self.nodes[node].replica.is_none() {
                    return Ok(());
                }
                self.turn(node)
            }
            Event::Persist(node) => {
                self.nodes[node].persist_scheduled = false;
                if self.nodes[node].replica.is_none() {
                    return Ok(());
                }
                if let Some(delay) = self.paused(node) {
                    // A stopped process syncs nothing.
                    self.nodes[node].persist_scheduled = true;
                    self.schedule(delay, Event::Persist(node));
                    return Ok(());
                }
                let (durable, messages) = match self.nodes[node].disk.sync_queued() {
                    Ok(synced) => synced,
                    Err(err) => return Err(format!("simulated disk of {} failed: {err}", node + 1)),
                };
                for message in messages {
                    self.send(node, message);
                }
                if let Some(replica) = self.nodes[node].replica.as_mut() {
                    replica.on_persisted(durable);
                }
                self.turn(node)
            }
            Event::Client { client, generation } => {
                if generation != self.clients[client].generation {
                    return Ok(());
                }
                self.client_wakes(client)
            }
            Event::Fault => {
                if !self.healed {
                    self.inject_fault()?;
                    self.schedule(self.swarm.fault_interval_ms, Event::Fault);
                }
                Ok(())
            }
            Event::Restart(node) => {
                if self.nodes[node].replica.is_none() {
                    self.start_node(node)?;
                }
                Ok(())
            }
            Event::ClearPartition(id) => {
                self.cut.remove(&id);
                Ok(())
            }
            Event::Heal => self.heal(),
            Event::Finish => {
                self.finished = true;
                Ok(())
            }
        }
    }

    /// `Some(delay)` while `node` is paused (a SIGSTOP, a long GC pause).
    fn paused(&self, node: usize) -> Option<u64> {
        let until = self.nodes[node].paused_until_ms;
        (until > self.now_ms).then(|| until - self.now_ms)
    }

    fn schedule_tick(&mut self, node: usize) {
        if !self.nodes[node].tick_scheduled {
            self.nodes[node].tick_scheduled = true;
            let every = self.nodes[node].tick_every_ms();
            self.schedule(every, Event::Tick(node));
        }
    }

    fn start_node(&mut self, node: usize) -> Result<(), String> {
        let blank = self.nodes[node].disk.clone().recover().map_err(|err| err.to_string())?.is_blank();
        if blank && self.nodes.len() > 1 {
            // As fencelockd: ask the peers it can reach before taking part.
            let peers: BTreeSet<u64> =
                (0..self.nodes.len()).filter(|other| *other != node).map(|other| other as u64 + 1).collect();
            let mut reports = BTreeMap::new();
            for other in 0..self.nodes.len() {
                let reachable = self.paused(other).is_none()
                    && !self
                        .cut
                        .values()
                        .any(|cut| cut.contains(&(node, other)) || cut.contains(&(other, node)));
                if !reachable || other == node {
                    continue;
                }
                if let Some(replica) = self.nodes[other].replica.as_ref() {
                    let (term, last_index) = replica.log_position();
                    let knows_you = replica.known_peers().contains(&(node as u64 + 1));
                    reports.insert(other as u64 + 1, PeerReport { knows_you, term, last_index });
                } else if self.nodes[other].probing {
                    reports.insert(other as u64 + 1, PeerReport::default());
                }
            }
            match rejoin::decide(&peers, &reports) {
                Start::Wait => {
                    if !self.nodes[node].probing {
                        self.note(&format!("{} starts blank and waits for its peers", node + 1));
                    }
                    self.nodes[node].probing = true;
                    let retry_ms = self.rng.range(10, 200);
                    self.schedule(retry_ms, Event::Restart(node));
                    return Ok(());
                }
                Start::Fresh => self.note(&format!("{} starts blank as a new member", node + 1)),
                Start::Rejoin(floor) => {
                    let membership = Membership { rejoin: Some(floor), ..Default::default() };
                    self.nodes[node]
                        .disk
                        .write(WriteBatch { membership: Some(&membership), ..Default::default() })
                        .map_err(|err| err.to_string())?;
                    if self.nodes[node].disk.is_async() {
                        self.nodes[node].disk.sync_queued().map_err(|err| err.to_string())?;
                    }
                    self.note(&format!(
                        "{} lost its data and rejoins under term {} index {}",
                        node + 1,
                        floor.term,
                        floor.last_index
                    ));
                }
            }
        }
        self.nodes[node].probing = false;
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let replica = Replica::open(self.nodes[node].config.clone(), self.nodes[node].disk.clone(), &logger)
            .map_err(|err| format!("node {} does not reopen: {err}", node + 1))?;
        self.checker.opened(node, replica.table());
        self.nodes[node].replica = Some(replica);
        self.draw_election_timeout(node);
        let disk = if self.nodes[node].disk.is_async() { "asynchronous" } else { "synchronous" };
        self.note(&format!("start {} ({disk} disk)", node + 1));
        self.schedule_tick(node);
        Ok(())
    }

    /// Replaces the election timeout raft-rs drew for `node` (when it opened
    /// or changed role or term) with one drawn from the seed.
    fn draw_election_timeout(&mut self, node: usize) {
        let ticks = self.rng.range(ELECTION_TICKS_MIN as u64, ELECTION_TICKS_MAX as u64) as usize;
        if let Some(replica) = self.nodes[node].replica.as_mut() {
            replica.pin_election_timeout(ticks);
        }
    }

    /// Whether a node that lost its disk has not caught up yet: the
    /// simulation loses at most one at a time (two of three would lose
    /// what only they acknowledged).
    fn any_node_recovering(&mut self) -> bool {
        for node in &mut self.nodes {
            if let Some(replica) = node.replica.as_ref() {
                node.recovering &= replica.status().rejoining;
            }
        }
        self.nodes.iter().any(|node| node.recovering)
    }

    /// The node dies (its unsynced writes with it), and with the swarm's
    /// odds its whole disk too; it restarts later.
    fn crash(&mut self, node: usize) {
        if self.nodes[node].replica.take().is_some() {
            self.nodes[node].disk.crash();
            self.note(&format!("crash {}", node + 1));
            if self.rng.chance(self.swarm.lose_disk_ppm) && !self.any_node_recovering() {
                let asynchronous = self.nodes[node].disk.is_async();
                self.nodes[node].disk = SimDisk::new(asynchronous);
                self.nodes[node].recovering = true;
                self.note(&format!("disk of {} lost", node + 1));
            }
            let down_ms = self.rng.range(200, 3_000);
            self.schedule(down_ms, Event::Restart(node));
        }
    }

    /// One turn of `node`: its time, one Ready, and what comes out.
    fn turn(&mut self, node: usize) -> Result<(), String> {
        let local_ms = self.nodes[node].local_ms(self.now_ms);
        let Some(replica) = self.nodes[node].replica.as_mut() else { return Ok(()) };
        replica.set_now(local_ms);
        if replica.run_ready().is_err() {
            // The disk died mid-turn: nothing of this turn leaves the node.
            self.crash(node);
            return Ok(());
        }
        let effects = replica.take_effects();
        let status = replica.status();
        let more = replica.has_ready();
        self.checker.turn(
            node,
            local_ms,
            status.role == Role::Leader,
            &effects.applied,
            status.applied_index,
            replica.table(),
        )?;
        for role in &effects.roles {
            self.note(&format!("node {} {role:?}", node + 1));
        }
        if !effects.roles.is_empty() {
            // raft-rs reset its election timeout with a draw of its own.
            self.draw_election_timeout(node);
        }
        for message in effects.messages {
            self.send(node, message);
        }
        for (id, reply) in effects.replies {
            self.reply(node, id, reply)?;
        }
        if more {
            self.schedule(0, Event::Poke(node));
        }
        self.schedule_persist(node);
        Ok(())
    }

    /// Starts an asynchronous disk's fsync when writes wait for one.
    fn schedule_persist(&mut self, node: usize) {
        let waiting = self.nodes[node].replica.as_ref().is_some_and(|replica| replica.writes_in_flight() > 0);
        if waiting && !self.nodes[node].persist_scheduled {
            self.nodes[node].persist_scheduled = true;
            let fsync_ms = self.rng.range(0, 4);
            self.schedule(fsync_ms, Event::Persist(node));
        }
    }

    fn send(&mut self, from: usize, message: Message) {
        let to = (message.to - 1) as usize;
        if to >= self.nodes.len() || self.cut.values().any(|cut| cut.contains(&(from, to))) {
            return;
        }
        if self.rng.chance(self.swarm.loss_ppm) {
            return;
        }
        let copies = if self.rng.chance(self.swarm.duplicate_ppm) { 2 } else { 1 };
        for _ in 0..copies {
            let delay = self.swarm.delay_min_ms + self.rng.range(0, self.swarm.delay_jitter_ms + 1);
            self.schedule(delay, Event::Deliver { to, message: Box::new(message.clone()) });
        }
    }

    // --- clients -----------------------------------------------------------

    /// Sets `client`'s timer, replacing any earlier one.
    fn wake(&mut self, client: usize, delay_ms: u64) {
        self.clients[client].generation += 1;
        let generation = self.clients[client].generation;
        self.schedule(delay_ms, Event::Client { client, generation });
    }

    fn client_wakes(&mut self, client: usize) -> Result<(), String> {
        if self.finished {
            return Ok(());
        }
        let state = std::mem::replace(&mut self.clients[client].state, ClientState::Idle);
        match state {
            ClientState::Idle => {
                let op = self.next_acquire(client);
                self.send_request(client, op)
            }
            ClientState::Waiting { id, op, deadline_ms } if self.now_ms >= deadline_ms => {
                // No answer: give the request up (a grant it gets later is a
                // ghost) and try again, with the same owner.
                self.requests.remove(&id);
                self.abandoned.insert(id, op.clone());
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
                    Op::Release { key, token }
                } else {
                    Op::Renew { key, token, lease_ms }
                };
                self.send_request(client, op)
            }
        }
    }

    fn next_acquire(&mut self, client: usize) -> Op {
        let after_heal = self.healed && self.now_ms >= self.config.fault_ms + HEAL_SETTLE_MS;
        let key = if after_heal && !self.clients[client].served_after_heal {
            self.clients[client].final_key.clone()
        } else {
            let name = format!("k{}", self.rng.range(0, 3));
            Key::new(name.into_bytes()).expect("a valid key")
        };
        let lease_ms = LeaseMs::new(self.rng.pick(&[600, 1_500, 4_000])).expect("a valid lease");
        let wait_ms = self.rng.pick(&[0, 0, 300, 2_000]);
        Op::Acquire { key, lease_ms, wait_ms }
    }

    fn send_request(&mut self, client: usize, op: Op) -> Result<(), String> {
        self.next_request += 1;
        let id = RequestId(self.next_request);
        let target = self.clients[client].target;
        let wait_ms = if let Op::Acquire { wait_ms, .. } = &op { *wait_ms } else { 0 };
        let deadline_ms = self.now_ms + REQUEST_TIMEOUT_MS + wait_ms;
        if self.nodes[target].replica.is_none() {
            // Connection refused: the client tries the next node shortly.
            self.clients[client].target = (target + 1) % self.nodes.len();
            self.clients[client].state = ClientState::Idle;
            self.wake(client, 10);
            return Ok(());
        }
        if let Op::Acquire { .. } = &op {
            if self.rng.chance(self.swarm.abandon_ppm) {
                // The client disconnects right after asking.
                self.abandoned.insert(id, op.clone());
                self.note(&format!("client {} abandons {}", client + 1, id.0));
                self.deliver_request(target, id, &op, client);
                self.clients[client].state = ClientState::Idle;
                let pause = self.rng.range(50, 300);
                self.wake(client, pause);
                return self.after_request(target);
            }
        }
        self.requests.insert(id, client);
        self.deliver_request(target, id, &op, client);
        self.clients[client].state = ClientState::Waiting { id, op, deadline_ms };
        self.wake(client, deadline_ms - self.now_ms);
        self.after_request(target)
    }

    fn deliver_request(&mut self, node: usize, id: RequestId, op: &Op, client: usize) {
        if self.paused(node).is_some() {
            // A paused node reads nothing: the request is as good as lost.
            return;
        }
        let owner = self.clients[client].owner.clone();
        let Some(replica) = self.nodes[node].replica.as_mut() else { return };
        match op.clone() {
            Op::Acquire { key, lease_ms, wait_ms } => replica.acquire(id, key, lease_ms, owner, wait_ms),
            Op::Renew { key, token, lease_ms } => {
                replica.propose(id, vec![Command::Renew { key, token, lease_ms }])
            }
            Op::Release { key, token } => {
                replica.propose(id, vec![Command::Release { key, token: Some(token) }])
            }
        }
    }

    fn after_request(&mut self, node: usize) -> Result<(), String> {
        if self.paused(node).is_none() && self.nodes[node].replica.is_some() {
            self.turn(node)?;
        }
        Ok(())
    }

    fn reply(&mut self, node: usize, id: RequestId, reply: Reply) -> Result<(), String> {
        if let Some(op) = self.abandoned.remove(&id) {
            // The asker is gone. A grant it got is a ghost: release it, as
            // the server does when a client connection has closed.
            if let (Op::Acquire { key, .. }, Ok(Response::Applied(results))) = (op, &reply) {
                if let [ApplyResult::Granted { token, .. }] = results.as_slice() {
                    self.note(&format!("ghost {key} {token}"));
                    if let Some(replica) = self.nodes[node].replica.as_mut() {
                        replica.release_ghost(key, *token);
                    }
                    self.schedule(0, Event::Poke(node));
                }
            }
            return Ok(());
        }
        let Some(client) = self.requests.remove(&id) else { return Ok(()) };
        let ClientState::Waiting { id: waiting_id, op, .. } =
            std::mem::replace(&mut self.clients[client].state, ClientState::Idle)
        else {
            return Ok(());
        };
        if waiting_id != id {
            return Ok(());
        }
        self.client_answered(client, op, reply)
    }

    fn client_answered(&mut self, client: usize, op: Op, reply: Reply) -> Result<(), String> {
        let pause = self.rng.range(5, 100);
        match (op, reply) {
            (Op::Acquire { key, lease_ms, .. }, Ok(Response::Applied(results))) => match results.as_slice() {
                [ApplyResult::Granted { token, .. }] => {
                    self.grants += 1;
                    self.checker.durability.acked_grant(&key, *token);
                    self.note(&format!("client {} granted {key} {token}", client + 1));
                    // The final key only proves service: hand it back at once.
                    let hold_ms = if key == self.clients[client].final_key {
                        self.rng.range(1, 50)
                    } else {
                        self.rng.range(50, 3 * lease_ms.get())
                    };
                    let release_at_ms = self.now_ms + hold_ms;
                    self.clients[client].state =
                        ClientState::Holding { key, token: *token, lease_ms, release_at_ms };
                    self.wake(client, (lease_ms.get() / 3).min(hold_ms));
                }
                other => return Err(format!("client {}: acquire answered {other:?}", client + 1)),
            },
            (Op::Renew { key, token, lease_ms }, Ok(Response::Applied(results))) => {
                match results.as_slice() {
                    [ApplyResult::Renewed { .. }] => {
                        self.checker.durability.acked_renewal(&key, token);
                        let release_at_ms = match &self.clients[client].state {
                            ClientState::Holding { release_at_ms, .. } => *release_at_ms,
                            _ => self.now_ms,
                        };
                        self.clients[client].state =
                            ClientState::Holding { key, token, lease_ms, release_at_ms };
                        self.wake(client, (lease_ms.get() / 3).max(1));
                    }
                    [ApplyResult::NotFound] => self.wake(client, pause),
                    other => return Err(format!("client {}: renew answered {other:?}", client + 1)),
                }
            }
            (Op::Release { key, token }, Ok(Response::Applied(results))) => {
                match results.as_slice() {
                    [ApplyResult::Released { .. }] => self.checker.durability.acked_release(&key, token),
                    [ApplyResult::NotFound] => {}
                    other => return Err(format!("client {}: release answered {other:?}", client + 1)),
                }
                if key == self.clients[client].final_key {
                    self.clients[client].served_after_heal = true;
                    self.checker.liveness.served(client);
                }
                self.wake(client, pause);
            }
            (op, Err(RequestError::NotLeader { leader_hint })) => {
                self.clients[client].target = match leader_hint {
                    Some(leader) => (leader.0 - 1) as usize,
                    None => (self.clients[client].target + 1) % self.nodes.len(),
                };
                self.retry(client, op, pause);
            }
            (
                op,
                Err(
                    RequestError::LeadershipLost { .. }
                    | RequestError::Dropped
                    | RequestError::Overloaded
                    | RequestError::Stopped,
                ),
            ) => self.retry(client, op, pause),
            (Op::Acquire { .. }, Err(RequestError::Held { .. } | RequestError::WaitTimedOut { .. })) => {
                self.wake(client, pause);
            }
            (op, other) => return Err(format!("client {}: {op:?} answered {other:?}", client + 1)),
        }
        Ok(())
    }

    /// Sends `op` again after `pause_ms`, keeping a held lock held meanwhile.
    fn retry(&mut self, client: usize, op: Op, pause_ms: u64) {
        self.clients[client].state = match op {
            Op::Acquire { .. } => ClientState::Idle,
            // The renewal's answer was lost: release soon rather than hold on.
            Op::Renew { key, token, lease_ms } => {
                ClientState::Holding { key, token, lease_ms, release_at_ms: self.now_ms }
            }
            Op::Release { key, token } => ClientState::Holding {
                key,
                token,
                lease_ms: LeaseMs::new(600).expect("a valid lease"),
                release_at_ms: 0,
            },
        };
        self.wake(client, pause_ms);
    }

    // --- faults --------------------------------------------------------------

    fn inject_fault(&mut self) -> Result<(), String> {
        let total: u64 = self.swarm.weights.iter().sum();
        if total == 0 {
            return Ok(());
        }
        self.faults += 1;
        let mut pick = self.rng.range(0, total);
        let mut kind = 0;
        while pick >= self.swarm.weights[kind] {
            pick -= self.swarm.weights[kind];
            kind += 1;
        }
        let n = self.nodes.len();
        let node = self.rng.range(0, n as u64) as usize;
        match kind {
            0 => {
                let mut cut = BTreeSet::new();
                let shape = self.rng.range(0, 3);
                let side: Vec<bool> = (0..n).map(|_| self.rng.chance(500_000)).collect();
                for a in 0..n {
                    for b in 0..n {
                        let split = match shape {
                            0 => (a == node) != (b == node),
                            1 => side[a] != side[b],
                            // One way only: node hears nobody.
                            _ => b == node && a != node,
                        };
                        if split {
                            cut.insert((a, b));
                        }
                    }
                }
                self.next_partition += 1;
                let id = self.next_partition;
                self.cut.insert(id, cut);
                let lasts = self.rng.range(200, 4_000);
                self.schedule(lasts, Event::ClearPartition(id));
                self.note(&format!("partition {id} shape {shape} around {}", node + 1));
            }
            1 => {
                if self.swarm.crash_mid_turn && self.nodes[node].replica.is_some() {
                    let writes = self.rng.range(0, 3) as u32;
                    self.nodes[node].disk.crash_after(writes);
                    self.note(&format!("disk of {} dies after {writes} writes", node + 1));
                } else {
                    self.crash(node);
                }
            }
            2 => {
                let pause = self.rng.range(100, 3_000);
                self.nodes[node].paused_until_ms = self.now_ms + pause;
                self.note(&format!("pause {} for {pause}", node + 1));
            }
            _ => {
                let jump = self.rng.range(50, 2_000);
                self.nodes[node].jump_ms += jump;
                self.note(&format!("clock of {} jumps {jump}", node + 1));
            }
        }
        Ok(())
    }

    fn heal(&mut self) -> Result<(), String> {
        self.healed = true;
        self.note("heal");
        self.cut.clear();
        self.swarm.loss_ppm = 0;
        self.swarm.duplicate_ppm = 0;
        self.swarm.abandon_ppm = 0;
        for node in 0..self.nodes.len() {
            self.nodes[node].paused_until_ms = 0;
            self.nodes[node].disk.disarm();
            if self.nodes[node].replica.is_none() {
                self.start_node(node)?;
            }
        }
        Ok(())
    }

    /// Stops the clients, lets the nodes agree, and checks what must hold at
    /// the end.
    fn finish(&mut self) -> Result<(), String> {
        let deadline = self.now_ms + QUIESCE_MS;
        let mut converged = None;
        while self.now_ms < deadline {
            if let Some(table) = self.agreed_table() {
                converged = Some(table);
                break;
            }
            let step_end = self.now_ms + 100;
            while let Some(((at, _), _)) = self.queue.first_key_value() {
                if *at > step_end {
                    break;
                }
                let Some(((at, _), event)) = self.queue.pop_first() else { break };
                self.now_ms = at;
                if matches!(event, Event::Client { .. }) {
                    continue;
                }
                self.events += 1;
                self.handle(event)?;
            }
            self.now_ms = step_end;
        }
        if converged.is_none() {
            for node in 0..self.nodes.len() {
                let status = self.nodes[node].replica.as_ref().map(Replica::status);
                self.note(&format!("at the end {}: {status:?}", node + 1));
            }
        }
        self.checker.liveness.finish(self.clients.len(), converged.is_some())?;
        if let Some(table) = converged {
            let table = fencelock_fsm::LockTable::restore(&table).map_err(|err| err.to_string())?;
            self.checker.durability.finish(&table)?;
        }
        Ok(())
    }

    /// The table every node holds, if they all hold the same at the same index.
    fn agreed_table(&self) -> Option<Vec<u8>> {
        let mut seen = None;
        for node in &self.nodes {
            let replica = node.replica.as_ref()?;
            let view = (replica.status().applied_index, convergence::digest(replica.table()));
            match seen {
                None => seen = Some(view),
                Some(first) if first != view => return None,
                Some(_) => {}
            }
        }
        self.nodes[0].replica.as_ref().map(|replica| replica.table().snapshot())
    }
}
