//! The nemeses: a fault schedule drawn from the seed, and the thread of
//! control that carries it out against a real [`Cluster`].
//!
//! [`schedule`] is pure: the same seed, suite, node count and duration give
//! the same steps (which fault, when, for how long, on which node or
//! split). Faults that name "the leader" find it when they strike, since
//! which node leads is up to the processes, not the seed.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::cluster::Cluster;
use crate::history::Recorder;
use crate::rng::SplitMix64;

/// The kinds of fault a suite may draw from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// kill -9 of the leader, restarted after the hold.
    KillLeader,
    /// kill -9 of a node drawn from the seed, restarted after the hold.
    KillRandom,
    /// kill -9 of every node at once, all restarted after the hold.
    KillAll,
    /// SIGSTOP of the leader, SIGCONT after the hold.
    PauseLeader,
    /// A lock holder stops past its lease before writing (a GC pause).
    PauseHolder,
    /// A minority drawn from the seed is cut off from the majority.
    PartitionHalves,
    /// The leader is cut off from every other node.
    IsolateLeader,
    /// Two sides that cannot reach each other, and one node that reaches
    /// both.
    Bridge,
    /// Every node restarts, one by one, with its clock running at its own
    /// rate, a majority of them fast (needs libfaketime; see
    /// `docs/suites.md`).
    ClockSkew,
    /// kill -9 of a node drawn from the seed and deletion of its data
    /// directory; restarted blank after the hold, it must rejoin.
    LoseData,
    /// Every client hangs up right after sending each acquire, before its
    /// answer, and retries the same acquire as the protocol says.
    ResetClients,
    /// A new node joins (`--join`) and is promoted; after the hold a member
    /// drawn from the seed (the leader, perhaps) is removed.
    GrowShrink,
    /// kill -9 of a member drawn from the seed, its removal, and a new node
    /// at a new address joining in its place.
    ReplaceNode,
}

impl FaultKind {
    /// Whether the fault needs what TLS hides: partitions (the proxies read
    /// the peers' plaintext hellos) and client resets (raw plain-TCP
    /// connections).
    pub fn needs_plain_peers(self) -> bool {
        matches!(
            self,
            FaultKind::PartitionHalves
                | FaultKind::IsolateLeader
                | FaultKind::Bridge
                | FaultKind::ResetClients
                | FaultKind::GrowShrink
                | FaultKind::ReplaceNode
        )
    }

    /// Whether the fault changes the membership.
    pub fn changes_membership(self) -> bool {
        matches!(self, FaultKind::GrowShrink | FaultKind::ReplaceNode)
    }

    pub const ALL: [FaultKind; 13] = [
        FaultKind::KillLeader,
        FaultKind::KillRandom,
        FaultKind::KillAll,
        FaultKind::PauseLeader,
        FaultKind::PauseHolder,
        FaultKind::PartitionHalves,
        FaultKind::IsolateLeader,
        FaultKind::Bridge,
        FaultKind::ClockSkew,
        FaultKind::LoseData,
        FaultKind::ResetClients,
        FaultKind::GrowShrink,
        FaultKind::ReplaceNode,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::KillLeader => "kill-leader",
            FaultKind::KillRandom => "kill-random",
            FaultKind::KillAll => "kill-all",
            FaultKind::PauseLeader => "pause-leader",
            FaultKind::PauseHolder => "pause-holder",
            FaultKind::PartitionHalves => "partition-halves",
            FaultKind::IsolateLeader => "isolate-leader",
            FaultKind::Bridge => "bridge",
            FaultKind::ClockSkew => "clock-skew",
            FaultKind::LoseData => "lose-data",
            FaultKind::ResetClients => "reset-clients",
            FaultKind::GrowShrink => "grow-shrink",
            FaultKind::ReplaceNode => "replace-node",
        }
    }

    pub fn from_name(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|kind| kind.name() == name)
    }

    /// How long the fault lasts, in ms.
    fn hold_range(self) -> (u64, u64) {
        match self {
            FaultKind::KillLeader | FaultKind::KillRandom | FaultKind::PauseLeader | FaultKind::LoseData => {
                (1_000, 3_000)
            }
            FaultKind::KillAll => (500, 2_000),
            // The nemesis only asks for the pause; the time covers the
            // holder's lease and overstay, so that the next fault does not
            // hide what the pause does.
            FaultKind::PauseHolder => (2_500, 4_000),
            FaultKind::PartitionHalves | FaultKind::IsolateLeader | FaultKind::Bridge => (1_500, 4_000),
            FaultKind::ClockSkew => (4_000, 8_000),
            // Long enough for a few hundred abandoned acquires.
            FaultKind::ResetClients => (2_000, 5_000),
            // The strike (a join, a catch-up, a promotion) takes seconds
            // itself; the hold covers it and some locking with the new node.
            FaultKind::GrowShrink | FaultKind::ReplaceNode => (4_000, 7_000),
        }
    }
}

/// One fault with everything the seed decides about it.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Fault {
    KillLeader,
    KillNode {
        node: u64,
    },
    KillAll,
    PauseLeader,
    /// Client `client` overstays its next lock by its lease plus `extra_ms`.
    PauseHolder {
        client: usize,
        extra_ms: u64,
    },
    /// `minority` is cut off from the other nodes.
    Partition {
        minority: Vec<u64>,
    },
    IsolateLeader,
    Bridge {
        left: Vec<u64>,
        bridge: u64,
        right: Vec<u64>,
    },
    /// Node `i + 1` runs with its clocks at `rates[i]` times real time.
    ClockSkew {
        rates: Vec<f64>,
    },
    LoseData {
        node: u64,
    },
    ResetClients,
    /// The member removed after the hold is the one at `victim_rank`
    /// (modulo the members' number) among the members by id.
    GrowShrink {
        victim_rank: u64,
    },
    /// The member killed and replaced is the one at `victim_rank`.
    ReplaceNode {
        victim_rank: u64,
    },
}

impl Fault {
    pub fn kind(&self) -> FaultKind {
        match self {
            Fault::KillLeader => FaultKind::KillLeader,
            Fault::KillNode { .. } => FaultKind::KillRandom,
            Fault::KillAll => FaultKind::KillAll,
            Fault::PauseLeader => FaultKind::PauseLeader,
            Fault::PauseHolder { .. } => FaultKind::PauseHolder,
            Fault::Partition { .. } => FaultKind::PartitionHalves,
            Fault::IsolateLeader => FaultKind::IsolateLeader,
            Fault::Bridge { .. } => FaultKind::Bridge,
            Fault::ClockSkew { .. } => FaultKind::ClockSkew,
            Fault::LoseData { .. } => FaultKind::LoseData,
            Fault::ResetClients => FaultKind::ResetClients,
            Fault::GrowShrink { .. } => FaultKind::GrowShrink,
            Fault::ReplaceNode { .. } => FaultKind::ReplaceNode,
        }
    }

    /// True for a fault of the cluster or of its client connections (as
    /// opposed to a client pausing): the windows that count as "during
    /// faults" in the figures.
    pub fn is_cluster_fault(&self) -> bool {
        !matches!(self, Fault::PauseHolder { .. })
    }
}

/// One step of the schedule: `fault` strikes `at_ms` after the run starts
/// and is undone `hold_ms` later.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Step {
    pub at_ms: u64,
    pub hold_ms: u64,
    pub fault: Fault,
}

/// The quiet time before the first fault and after the last one: the
/// cluster settles first, and the run ends by watching it serve again.
pub fn quiet_ms(duration_ms: u64) -> u64 {
    (duration_ms / 6).clamp(1_000, 5_000)
}

/// The schedule of a run: faults of `kinds`, one at a time, dealt from a
/// shuffled deck so that a short run still sees each kind once when it has
/// room (membership changes first in each deck), separated by short quiet
/// gaps.
pub fn schedule(
    kinds: &[FaultKind],
    nodes: u64,
    clients: usize,
    duration_ms: u64,
    rng: &mut SplitMix64,
) -> Vec<Step> {
    let mut steps = Vec::new();
    if kinds.is_empty() || nodes == 0 {
        return steps;
    }
    let ids: Vec<u64> = (1..=nodes).collect();
    let quiet = quiet_ms(duration_ms);
    let end = duration_ms.saturating_sub(quiet);
    let mut at = quiet;
    let mut deck: Vec<FaultKind> = Vec::new();
    while at < end {
        if deck.is_empty() {
            deck = kinds.to_vec();
            rng.shuffle(&mut deck);
            // Membership changes are dealt first (the deck is dealt from
            // its end): they take longest, and a short run sees each.
            deck.sort_by_key(|kind| kind.changes_membership());
        }
        let Some(kind) = deck.pop() else { break };
        let (low, high) = kind.hold_range();
        let hold = rng.between(low, high).min(end - at);
        let fault = draw(kind, &ids, clients, rng);
        steps.push(Step { at_ms: at, hold_ms: hold, fault });
        at += hold + rng.between(500, 1_500);
    }
    steps
}

/// The seed's choices for one fault of `kind`.
fn draw(kind: FaultKind, ids: &[u64], clients: usize, rng: &mut SplitMix64) -> Fault {
    let mut shuffled = ids.to_vec();
    rng.shuffle(&mut shuffled);
    match kind {
        FaultKind::KillLeader => Fault::KillLeader,
        FaultKind::KillRandom => Fault::KillNode { node: shuffled[0] },
        FaultKind::LoseData => Fault::LoseData { node: shuffled[0] },
        FaultKind::KillAll => Fault::KillAll,
        FaultKind::PauseLeader => Fault::PauseLeader,
        FaultKind::ResetClients => Fault::ResetClients,
        FaultKind::GrowShrink => Fault::GrowShrink { victim_rank: rng.below(16) },
        FaultKind::ReplaceNode => Fault::ReplaceNode { victim_rank: rng.below(16) },
        FaultKind::PauseHolder => Fault::PauseHolder {
            client: rng.below(clients.max(1) as u64) as usize,
            extra_ms: rng.between(300, 1_500),
        },
        FaultKind::PartitionHalves => {
            // The largest minority: 1 of 3, 2 of 5.
            let size = (ids.len() - 1) / 2;
            let mut minority = shuffled[..size.max(1)].to_vec();
            minority.sort_unstable();
            Fault::Partition { minority }
        }
        FaultKind::IsolateLeader => Fault::IsolateLeader,
        FaultKind::Bridge => {
            // Sides of (n - 1) / 2 nodes; the bridge with either side is a
            // majority, so a leader may sit on either side or on the bridge.
            let side = (ids.len() - 1) / 2;
            let bridge = shuffled[0];
            let mut left = shuffled[1..1 + side].to_vec();
            let mut right = shuffled[1 + side..].to_vec();
            left.sort_unstable();
            right.sort_unstable();
            Fault::Bridge { left, bridge, right }
        }
        FaultKind::ClockSkew => {
            // Fast clocks are the dangerous ones: a fast leader expires
            // leases early, a slow one only late. A majority runs fast, so
            // that once a slow leader is paused, a fast node wins.
            let fast = ids.len() / 2 + 1;
            let mut rates = vec![1.0; ids.len()];
            for (rank, id) in shuffled.iter().enumerate() {
                let choices: &[f64] = if rank < fast { &[1.5, 2.0] } else { &[0.5, 1.0] };
                if let Some(slot) = usize::try_from(*id - 1).ok().and_then(|index| rates.get_mut(index)) {
                    *slot = rng.pick(choices).copied().unwrap_or(1.0);
                }
            }
            Fault::ClockSkew { rates }
        }
    }
}

/// What one step did, for the history and the report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FaultRecord {
    pub kind: FaultKind,
    pub fault: Fault,
    /// The nodes it struck (the leader, once it is known).
    pub nodes: Vec<u64>,
    pub start_us: u64,
    pub end_us: u64,
    /// When the nemesis began striking (before `start_us` when striking
    /// takes time, as restarting every node with a skewed clock does).
    pub begin_us: u64,
    /// Where recovery is timed from: the fault's start, or for kill-all
    /// the restart.
    pub recover_from_us: u64,
    /// Who led, and in which term, just before the fault.
    pub leader_before: Option<u64>,
    pub term_before: Option<u64>,
    /// True when the fault took the leader away: killed, paused, or cut off
    /// from a majority.
    pub leader_lost: bool,
    /// The directed links the fault cut (from, to).
    pub links_cut: Vec<(u64, u64)>,
    /// What else happened, in words (who led under a skewed clock).
    pub note: Option<String>,
    /// Why the fault could not be (fully) carried out, if it could not.
    pub error: Option<String>,
}

/// Per client: a pause the nemesis asks it to take at its next lock, as
/// the overstay beyond the lease in ms plus one (0: none asked).
#[derive(Debug)]
pub struct PauseRequests(Vec<AtomicU64>);

impl PauseRequests {
    pub fn new(clients: usize) -> PauseRequests {
        PauseRequests((0..clients).map(|_| AtomicU64::new(0)).collect())
    }

    pub fn ask(&self, client: usize, extra_ms: u64) {
        if let Some(slot) = self.0.get(client) {
            slot.store(extra_ms.saturating_add(1), Ordering::SeqCst);
        }
    }

    /// The overstay asked of `client`, once.
    pub fn take(&self, client: usize) -> Option<u64> {
        let asked = self.0.get(client)?.swap(0, Ordering::SeqCst);
        asked.checked_sub(1)
    }
}

/// Whether the clients hang up on their acquires, and how many they
/// abandoned so.
#[derive(Debug, Default)]
pub struct Resets {
    on: AtomicBool,
    abandoned: AtomicU64,
}

impl Resets {
    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::SeqCst)
    }

    /// Counts one acquire sent on a connection closed before its answer.
    pub fn abandoned(&self) {
        self.abandoned.fetch_add(1, Ordering::SeqCst);
    }

    fn set(&self, on: bool) {
        self.on.store(on, Ordering::SeqCst);
    }

    fn abandoned_so_far(&self) -> u64 {
        self.abandoned.load(Ordering::SeqCst)
    }
}

/// What the nemesis asks of the client threads.
#[derive(Debug)]
pub struct ClientFaults {
    pub pauses: PauseRequests,
    pub resets: Resets,
}

impl ClientFaults {
    pub fn new(clients: usize) -> ClientFaults {
        ClientFaults { pauses: PauseRequests::new(clients), resets: Resets::default() }
    }
}

/// How to start a node whose clock runs at `rate`: the environment for
/// libfaketime, or `None` when it is not installed.
pub type SkewEnv = dyn Fn(f64) -> Option<Vec<(String, String)>>;

/// Carries out `steps` on `cluster`, each at its time after `start`, and
/// heals everything at the end. Returns what each step did.
pub fn run(
    steps: &[Step],
    cluster: &mut Cluster,
    start: Instant,
    recorder: &Recorder,
    clients: &ClientFaults,
    skew_env: &SkewEnv,
) -> Vec<FaultRecord> {
    let mut records = Vec::new();
    for step in steps {
        sleep_until(start + Duration::from_millis(step.at_ms));
        let leader = cluster.leader();
        let mut record = FaultRecord {
            kind: step.fault.kind(),
            fault: step.fault.clone(),
            nodes: Vec::new(),
            start_us: 0,
            end_us: 0,
            begin_us: recorder.now_us(),
            recover_from_us: 0,
            leader_before: leader.map(|(id, _)| id),
            term_before: leader.map(|(_, term)| term),
            leader_lost: false,
            links_cut: Vec::new(),
            note: None,
            error: None,
        };
        // The fault is in effect once the strike is done (killing three
        // nodes one by one takes a few milliseconds, in which the old leader
        // may still commit), unless the strike says otherwise.
        let mut started = 0;
        let now = || recorder.now_us();
        let abandoned_before = clients.resets.abandoned_so_far();
        if let Err(err) = strike(&step.fault, cluster, &mut record, clients, skew_env, &mut started, &now) {
            record.error = Some(format!("{err:#}"));
        }
        record.start_us = if started > 0 { started } else { recorder.now_us() };
        record.links_cut = cluster.rules.blocked();
        sleep_until(start + Duration::from_millis(step.at_ms + step.hold_ms));
        if let Err(err) = heal(&step.fault, cluster, &record, clients) {
            let previous = record.error.take().map(|e| format!("{e}; ")).unwrap_or_default();
            record.error = Some(format!("{previous}healing: {err:#}"));
        }
        record.end_us = recorder.now_us();
        if matches!(step.fault, Fault::ResetClients) {
            let abandoned = clients.resets.abandoned_so_far() - abandoned_before;
            let seconds = (record.end_us.saturating_sub(record.start_us) as f64 / 1e6).max(1e-3);
            record.note = Some(format!(
                "{abandoned} acquires abandoned before their answer and retried ({:.0}/s)",
                abandoned as f64 / seconds
            ));
        }
        // With every node down, recovery is what follows the restart.
        record.recover_from_us =
            if matches!(step.fault, Fault::KillAll) { record.end_us } else { record.start_us };
        let target = match &step.fault {
            Fault::PauseHolder { client, extra_ms } => format!("client {client} overstays by {extra_ms} ms"),
            Fault::ResetClients => "every client".to_owned(),
            _ => format!("nodes {:?}", record.nodes),
        };
        eprintln!(
            "  fault {:<16} {target} from {:.1}s to {:.1}s{}{}",
            record.kind.name(),
            record.start_us as f64 / 1e6,
            record.end_us as f64 / 1e6,
            record.note.as_deref().map(|note| format!(": {note}")).unwrap_or_default(),
            record.error.as_deref().map(|e| format!(" ({e})")).unwrap_or_default()
        );
        records.push(record);
    }
    records
}

/// Strikes `fault`. `started` is set (from `now`) when the fault took
/// effect before the strike ended.
fn strike(
    fault: &Fault,
    cluster: &mut Cluster,
    record: &mut FaultRecord,
    clients: &ClientFaults,
    skew_env: &SkewEnv,
    started: &mut u64,
    now: &dyn Fn() -> u64,
) -> anyhow::Result<()> {
    let leader = record.leader_before;
    let need_leader = || leader.ok_or_else(|| anyhow::anyhow!("no leader to strike"));
    match fault {
        Fault::KillLeader => {
            let id = need_leader()?;
            record.nodes = vec![id];
            record.leader_lost = true;
            cluster.kill9(id)
        }
        Fault::KillNode { node } => {
            let node = member(cluster, *node)?;
            record.nodes = vec![node];
            record.leader_lost = leader == Some(node);
            cluster.kill9(node)
        }
        Fault::LoseData { node } => {
            let node = member(cluster, *node)?;
            record.nodes = vec![node];
            record.leader_lost = leader == Some(node);
            cluster.kill9(node)?;
            cluster.wipe(node)
        }
        Fault::GrowShrink { .. } => {
            let joined = cluster.join()?;
            record.nodes = vec![joined];
            Ok(())
        }
        Fault::ReplaceNode { victim_rank } => {
            let victim = victim(cluster, *victim_rank)?;
            record.nodes = vec![victim];
            record.leader_lost = leader == Some(victim);
            cluster.kill9(victim)?;
            cluster.remove(victim)?;
            let joined = cluster.join()?;
            record.nodes.push(joined);
            record.note =
                Some(format!("node {victim} killed and removed, node {joined} joined in its place"));
            Ok(())
        }
        Fault::KillAll => {
            record.nodes = cluster.ids();
            record.leader_lost = leader.is_some();
            for id in cluster.ids() {
                cluster.kill9(id)?;
            }
            Ok(())
        }
        Fault::PauseLeader => {
            let id = need_leader()?;
            record.nodes = vec![id];
            record.leader_lost = true;
            cluster.pause(id)
        }
        Fault::PauseHolder { client, extra_ms } => {
            clients.pauses.ask(*client, *extra_ms);
            Ok(())
        }
        Fault::ResetClients => {
            clients.resets.set(true);
            Ok(())
        }
        Fault::Partition { minority } => {
            let majority: Vec<u64> = cluster.ids().into_iter().filter(|id| !minority.contains(id)).collect();
            record.nodes = minority.clone();
            record.leader_lost = leader.is_some_and(|id| minority.contains(&id));
            cluster.rules.separate(minority, &majority);
            Ok(())
        }
        Fault::IsolateLeader => {
            let id = need_leader()?;
            let rest: Vec<u64> = cluster.ids().into_iter().filter(|other| *other != id).collect();
            record.nodes = vec![id];
            record.leader_lost = true;
            cluster.rules.separate(&[id], &rest);
            Ok(())
        }
        Fault::Bridge { left, bridge, right } => {
            record.nodes = vec![*bridge];
            cluster.rules.separate(left, right);
            Ok(())
        }
        Fault::ClockSkew { rates } => {
            let skewed: Vec<(u64, f64)> = cluster.ids().into_iter().zip(rates.iter().copied()).collect();
            record.nodes = cluster.ids();
            record.leader_lost = leader.is_some();
            for (id, rate) in &skewed {
                let env = if (*rate - 1.0).abs() < f64::EPSILON {
                    Vec::new()
                } else {
                    skew_env(*rate).ok_or_else(|| anyhow::anyhow!("libfaketime is not installed"))?
                };
                restart_with(cluster, *id, env)?;
            }
            *started = now();
            // A fast clock matters on the leader, which decides expiries:
            // while a slow node leads, pause it so that the others (a fast
            // majority) elect one of their own. A few tries at most.
            let fast = |id: u64| skewed.iter().any(|(node, rate)| *node == id && *rate > 1.0);
            let mut nudges = 0;
            let mut leader_now = None;
            loop {
                let Ok(current) = cluster.wait_for_leader(Duration::from_secs(3)) else { break };
                leader_now = Some(current);
                if fast(current) || nudges == 4 {
                    break;
                }
                cluster.pause(current)?;
                sleep_until(Instant::now() + Duration::from_millis(800));
                cluster.resume(current)?;
                nudges += 1;
            }
            let clocks: Vec<String> = skewed.iter().map(|(id, rate)| format!("{id}: x{rate}")).collect();
            let rate_of =
                |id: u64| skewed.iter().find(|(node, _)| *node == id).map_or(1.0, |(_, rate)| *rate);
            record.note = Some(match leader_now {
                Some(id) => {
                    format!(
                        "clocks {}; node {id} leads (x{}) after {nudges} nudge(s)",
                        clocks.join(", "),
                        rate_of(id)
                    )
                }
                None => format!("clocks {}; no leader seen", clocks.join(", ")),
            });
            Ok(())
        }
    }
}

fn heal(
    fault: &Fault,
    cluster: &mut Cluster,
    record: &FaultRecord,
    clients: &ClientFaults,
) -> anyhow::Result<()> {
    match fault {
        Fault::KillLeader | Fault::KillNode { .. } | Fault::KillAll => {
            for id in &record.nodes {
                if !cluster.is_running(*id) {
                    cluster.launch(*id)?;
                }
            }
            Ok(())
        }
        Fault::PauseLeader => {
            for id in &record.nodes {
                cluster.resume(*id)?;
            }
            Ok(())
        }
        Fault::GrowShrink { victim_rank } => {
            let victim = victim(cluster, *victim_rank)?;
            let was_leader = cluster.leader().map(|(id, _)| id) == Some(victim);
            cluster.remove(victim)?;
            let joined = record.nodes.first().map_or_else(|| "none".to_owned(), u64::to_string);
            let leader = if was_leader { " (the leader)" } else { "" };
            eprintln!("  grow-shrink: node {joined} joined; node {victim}{leader} removed");
            Ok(())
        }
        Fault::ReplaceNode { .. } => Ok(()),
        Fault::LoseData { .. } => {
            let Some(&node) = record.nodes.first() else { return Ok(()) };
            cluster.launch(node)?;
            // The next fault waits until the node has caught up: two nodes of
            // three rejoining at once could never elect (docs/suites.md).
            cluster.wait_for_rejoin(node, REJOIN_WITHIN)
        }
        Fault::PauseHolder { .. } => Ok(()),
        Fault::ResetClients => {
            clients.resets.set(false);
            Ok(())
        }
        Fault::Partition { .. } | Fault::IsolateLeader | Fault::Bridge { .. } => {
            cluster.rules.heal();
            Ok(())
        }
        Fault::ClockSkew { .. } => {
            for id in &record.nodes {
                restart_with(cluster, *id, Vec::new())?;
            }
            Ok(())
        }
    }
}

/// Member `id`, or the member at its rank once membership changes have
/// retired it.
fn member(cluster: &Cluster, id: u64) -> anyhow::Result<u64> {
    cluster.resolve(id).ok_or_else(|| anyhow::anyhow!("no member left"))
}

/// The member at `rank` to remove; but never one of the last two of the
/// initial nodes, whose addresses are the workload clients' endpoints (a
/// client configured with three addresses keeps two that answer).
fn victim(cluster: &Cluster, rank: u64) -> anyhow::Result<u64> {
    let drawn = cluster.member_at(rank).ok_or_else(|| anyhow::anyhow!("no member left"))?;
    let ids = cluster.ids();
    let initial = ids.iter().filter(|id| cluster.is_initial(**id)).count();
    if !cluster.is_initial(drawn) || initial > 2 {
        return Ok(drawn);
    }
    let joined: Vec<u64> = ids.into_iter().filter(|id| !cluster.is_initial(*id)).collect();
    let len = u64::try_from(joined.len()).unwrap_or(0);
    if len == 0 {
        anyhow::bail!("no member to remove: only the last two initial nodes are left");
    }
    Ok(joined[usize::try_from(rank % len).unwrap_or(0)])
}

/// How long a node that lost its data may take to rejoin and catch up.
const REJOIN_WITHIN: Duration = Duration::from_secs(30);

/// kill -9 and restart of node `id` with `env`, then a wait (bounded) for a
/// leader, so that a rolling restart never takes two nodes down at once.
fn restart_with(cluster: &mut Cluster, id: u64, env: Vec<(String, String)>) -> anyhow::Result<()> {
    cluster.kill9(id)?;
    cluster.set_env(id, env)?;
    cluster.launch(id)?;
    // No leader within the bound is not an error here: the checks after the
    // run judge availability.
    let _ = cluster.wait_for_leader(Duration::from_secs(3));
    Ok(())
}

/// Sleeps until `when`: the schedule's clock, not a wait for a condition.
fn sleep_until(when: Instant) {
    let now = Instant::now();
    if when > now {
        std::thread::sleep(when - now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_its_schedule_and_a_short_run_sees_every_kind() {
        let kinds = [FaultKind::KillLeader, FaultKind::KillRandom, FaultKind::KillAll];
        let a = schedule(&kinds, 3, 8, 60_000, &mut SplitMix64::new(7));
        let b = schedule(&kinds, 3, 8, 60_000, &mut SplitMix64::new(7));
        assert_eq!(a, b);
        assert_ne!(a, schedule(&kinds, 3, 8, 60_000, &mut SplitMix64::new(8)));
        let seen: Vec<FaultKind> = a.iter().map(|step| step.fault.kind()).collect();
        for kind in kinds {
            assert!(seen.contains(&kind), "{kind:?} missing from {seen:?}");
        }
        // One fault at a time, all inside the run, with quiet at both ends.
        let quiet = quiet_ms(60_000);
        for pair in a.windows(2) {
            assert!(pair[0].at_ms + pair[0].hold_ms < pair[1].at_ms);
        }
        assert!(a.first().is_some_and(|step| step.at_ms == quiet));
        assert!(a.iter().all(|step| step.at_ms + step.hold_ms <= 60_000 - quiet));
    }

    #[test]
    fn membership_changes_are_dealt_first_so_a_short_run_sees_them() {
        let kinds = [FaultKind::GrowShrink, FaultKind::ReplaceNode, FaultKind::KillRandom];
        for seed in 0..50 {
            let steps = schedule(&kinds, 3, 8, 15_000, &mut SplitMix64::new(seed));
            let first: Vec<FaultKind> = steps.iter().take(2).map(|step| step.fault.kind()).collect();
            assert_eq!(first.len(), 2, "seed {seed}: {steps:?}");
            assert!(first.iter().all(|kind| kind.changes_membership()), "seed {seed}: {first:?}");
            assert_ne!(first[0], first[1], "seed {seed}");
        }
        // Victims are drawn from the seed too.
        let a = schedule(&kinds, 3, 8, 60_000, &mut SplitMix64::new(1));
        assert_eq!(a, schedule(&kinds, 3, 8, 60_000, &mut SplitMix64::new(1)));
    }

    #[test]
    fn splits_have_the_right_shapes() {
        let mut rng = SplitMix64::new(3);
        for nodes in [3u64, 5] {
            let ids: Vec<u64> = (1..=nodes).collect();
            for _ in 0..50 {
                match draw(FaultKind::PartitionHalves, &ids, 4, &mut rng) {
                    Fault::Partition { minority } => assert_eq!(minority.len() as u64, (nodes - 1) / 2),
                    other => panic!("{other:?}"),
                }
                match draw(FaultKind::Bridge, &ids, 4, &mut rng) {
                    Fault::Bridge { left, bridge, right } => {
                        assert_eq!(left.len(), right.len());
                        assert_eq!(left.len() + right.len() + 1, ids.len());
                        assert!(!left.contains(&bridge) && !right.contains(&bridge));
                    }
                    other => panic!("{other:?}"),
                }
                match draw(FaultKind::PauseHolder, &ids, 4, &mut rng) {
                    Fault::PauseHolder { client, extra_ms } => {
                        assert!(client < 4);
                        assert!((300..=1_500).contains(&extra_ms));
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    #[test]
    fn a_pause_request_is_taken_once() {
        let pauses = PauseRequests::new(2);
        assert_eq!(pauses.take(0), None);
        pauses.ask(1, 0);
        assert_eq!(pauses.take(1), Some(0));
        assert_eq!(pauses.take(1), None);
        pauses.ask(7, 10);
        assert_eq!(pauses.take(7), None);
    }
}
