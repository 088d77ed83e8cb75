//! [`Swarm`]: the fault mix of one run, drawn from its seed (swarm
//! testing). `faults.rs` carries the faults out.

use crate::rng::Rng;

/// The fault mix of one run, drawn from its seed.
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
    /// Clients abandoning an acquire before its answer (a disconnect, and
    /// they give it up).
    pub abandon_ppm: u64,
    /// Clients whose connection drops right after they sent a request; they
    /// send the same request again on a new connection.
    pub reset_ppm: u64,
    /// Clock drift bound, in parts per million, for each node.
    pub drift_ppm_max: u64,
    /// Crashes that also lose the node's disk, which then starts blank and
    /// rejoins (`fencelock_raft::rejoin`), one node at a time.
    pub lose_disk_ppm: u64,
}

impl Swarm {
    pub(crate) fn draw(rng: &mut Rng) -> Swarm {
        Swarm {
            loss_ppm: rng.pick(&[0, 1_000, 20_000, 100_000]),
            duplicate_ppm: rng.pick(&[0, 10_000, 50_000]),
            delay_min_ms: rng.pick(&[0, 1, 5]),
            delay_jitter_ms: rng.pick(&[1, 10, 40]),
            fault_interval_ms: rng.pick(&[300, 1_000, 3_000]),
            weights: [rng.range(0, 4), rng.range(0, 4), rng.range(0, 4), rng.range(0, 3)],
            crash_mid_turn: rng.chance(500_000),
            abandon_ppm: rng.pick(&[0, 20_000, 100_000]),
            reset_ppm: rng.pick(&[0, 50_000, 200_000, 500_000]),
            drift_ppm_max: rng.pick(&[0, 1_000, 50_000, 500_000]),
            lose_disk_ppm: rng.pick(&[0, 0, 300_000]),
        }
    }
}
