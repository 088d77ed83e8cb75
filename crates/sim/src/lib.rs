//! Deterministic simulation of a whole fencelock cluster from one seed.
//!
//! N real replicas (`fencelock_raft::Replica`: raft-rs, the lock table and
//! the lease tracker, the production code) run in one thread. Everything
//! around them is simulated and drawn from the seed, the fault mix too
//! (swarm testing):
//! - the network: delay, loss, duplication, reordering (by jitter),
//!   partitions, one-way links;
//! - each node's clock: drift, forward jumps, pauses (a stopped process);
//! - crashes and restarts, on a simulated disk where a crash can strike
//!   between two writes of one turn; a crash may also lose the disk (one
//!   node at a time), and the node then starts blank and asks the peers it
//!   can reach whether to start anew or rejoin (`fencelock_raft::rejoin`);
//! - clients: acquires with and without waiting, renewals, releases, and
//!   disconnects in the middle of a request; some clients take read-write
//!   locks and semaphore permits instead of plain locks; some hold several
//!   keys under a session, keep it alive, close it or let it lapse;
//! - the command level the cluster is founded at: this build's
//!   ([`fencelock_types::LEVEL`]) for most seeds, 1 or 2 for one seed in
//!   eight each ([`founding_level`]), with old builds among the nodes that
//!   are upgraded (restarted) during the faults; the leader must raise the
//!   level once every hello says LEVEL, and until then requests that need
//!   it are refused (`RequestError::LevelNotReached`) and retried;
//! - membership changes, for one seed in seven by default (`--membership
//!   seed`, [`membership_changes`]), with `always` for every seed, `never`
//!   for none: during the faults an operator grows the cluster (a new blank node,
//!   added as a learner, promoted once caught up), shrinks it (a voter
//!   removed, the leader too, never below three voters) or replaces a
//!   node (both), through admin requests it retries as an operator would;
//!   a removed node stops and counts no more (`membership.rs`).
//!
//! A run has a fault phase, then a heal phase in which the cluster must
//! converge and serve every client again. The invariants in [`invariants`]
//! are checked as it goes. raft-rs draws election timeouts from an unseeded
//! generator; the world overrides each draw (at start and after every role
//! or term change) with one from the seed (`Replica::pin_election_timeout`),
//! so that timeouts still differ from election to election, as raft needs to
//! break ties, and a seed replays byte for byte (its [`Report::trace_digest`] is
//! the same on every run). `SIM_TRACE=1` prints the trace's notes (faults,
//! starts, rejoins) to stderr as a run makes them.
//!
//! ```
//! let report = fencelock_sim::run(fencelock_sim::SimConfig::new(7, 3));
//! assert!(report.result.is_ok(), "{report}");
//! ```
//!
//! Architecture invariants: no threads, no sockets, no wall clock, no
//! unseeded randomness. It builds on types, fsm and raft; never on net or
//! server.
//!
//! Modules, each using only those before it: `rng`, `clock`, `disk`,
//! `network`, [`invariants`], each part's state (`swarm`, `builds`,
//! `client`, `operator`), `world` (the queue and the nodes), then each
//! part's events, handled on the world (`faults`, `upgrade`, `clients`,
//! `membership`).

pub mod invariants;

mod builds;
mod client;
mod clients;
mod clock;
mod disk;
mod faults;
mod membership;
mod network;
mod operator;
mod rng;
mod swarm;
mod upgrade;
mod world;

pub use membership::membership_changes;
pub use upgrade::founding_level;

use std::fmt;

/// What to simulate.
#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    pub nodes: usize,
    /// Clients of plain locks.
    pub clients: usize,
    /// Clients of a read-write lock and a semaphore.
    pub shared_clients: usize,
    /// Clients that hold plain and shared keys under a session.
    pub session_clients: usize,
    /// Simulated milliseconds of faults, then of healing.
    pub fault_ms: u64,
    pub heal_ms: u64,
    /// The command level the cluster is founded at: by default drawn from
    /// the seed ([`founding_level`]).
    pub founding_level: u32,
    /// Whether an operator changes the membership during the faults: by
    /// default as [`membership_changes`] draws it from the seed (one seed
    /// in seven).
    pub membership: bool,
}

impl SimConfig {
    pub fn new(seed: u64, nodes: usize) -> SimConfig {
        SimConfig {
            seed,
            nodes,
            clients: 5,
            shared_clients: 3,
            session_clients: 1,
            fault_ms: 20_000,
            heal_ms: 10_000,
            founding_level: founding_level(seed),
            membership: membership_changes(seed),
        }
    }
}

/// A broken invariant, and when.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub at_ms: u64,
    pub message: String,
}

/// The outcome of one run.
#[derive(Clone, Debug)]
pub struct Report {
    pub seed: u64,
    pub nodes: usize,
    /// Simulated time covered.
    pub sim_ms: u64,
    pub events: u64,
    pub grants: u64,
    pub faults: u64,
    /// The command level the cluster was founded at.
    pub founding_level: u32,
    /// Whether an operator changed the membership during the faults.
    pub membership: bool,
    /// Members the operator was told were added, and removed.
    pub members_added: u64,
    pub members_removed: u64,
    /// Client acknowledgements checked for durability.
    pub acknowledgements: usize,
    /// How often each check judged something.
    pub judged: Vec<(&'static str, u64)>,
    /// CRC-32 of the run's trace: equal for equal seeds.
    pub trace_digest: u32,
    /// The fault mix drawn from the seed.
    pub swarm: String,
    pub result: Result<(), Violation>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} ({} nodes, level {}): {} simulated s, {} events, {} grants, {} faults, {} acks, trace {:08x}: ",
            self.seed,
            self.nodes,
            self.founding_level,
            self.sim_ms / 1_000,
            self.events,
            self.grants,
            self.faults,
            self.acknowledgements,
            self.trace_digest
        )?;
        if self.membership {
            write!(f, "{} members added, {} removed: ", self.members_added, self.members_removed)?;
        }
        match &self.result {
            Ok(()) => write!(f, "ok"),
            Err(violation) => {
                write!(
                    f,
                    "VIOLATION at {} ms: {}\n  swarm: {}\n  replay: cargo xtask sim --seed {} --nodes {}",
                    violation.at_ms, violation.message, self.swarm, self.seed, self.nodes
                )?;
                // A level other than the seed's own was asked for.
                if self.founding_level != founding_level(self.seed) {
                    write!(f, " --founding-level {}", self.founding_level)?;
                }
                if self.membership {
                    write!(f, " --membership always")?;
                }
                Ok(())
            }
        }
    }
}

/// Runs one simulation. A panic inside (raft-rs's own fatal checks, an
/// assertion of ours) is reported as a violation of the seed, not lost.
pub fn run(config: SimConfig) -> Report {
    let (seed, nodes, founding_level, membership) =
        (config.seed, config.nodes, config.founding_level, config.membership);
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| world::World::new(config).run())) {
        Ok(report) => report,
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|text| (*text).to_owned()))
                .unwrap_or_else(|| "a panic without a message".to_owned());
            Report {
                seed,
                nodes,
                sim_ms: 0,
                events: 0,
                grants: 0,
                faults: 0,
                founding_level,
                membership,
                members_added: 0,
                members_removed: 0,
                acknowledgements: 0,
                judged: Vec::new(),
                trace_digest: 0,
                swarm: String::new(),
                result: Err(Violation { at_ms: 0, message: format!("panic: {message}") }),
            }
        }
    }
}

#[cfg(test)]
mod tests;
