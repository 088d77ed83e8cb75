//! The command level a run founds its cluster at, and how it gets raised:
//! old builds upgraded one by one, and the hellos that tell the leader.
//!
//! Most seeds found their cluster at this build's level
//! ([`fencelock_types::LEVEL`]). One seed in eight founds it at level 1, as
//! a build before command levels did, and one in eight at level 2
//! (`Config::founding_level` on every node), so that the leader's raise
//! (`Command::RaiseLevel`, proposed once every member's hello says it
//! applies LEVEL) runs under the faults. In such a seed each node is, with
//! even odds, an old build: its hellos say an older level (0, a build before
//! levels, or 2) until its upgrade, a restart at a time drawn in the fault
//! phase, after which they say LEVEL. Only its hellos are old: it runs this
//! build's code throughout, so an old leader raises the level as a new one
//! would. Every node has been upgraded by the heal, so the cluster must end
//! at LEVEL (`invariants::levels`).
//!
//! Hellos: fencelockd feeds a running node every peer's hello as its
//! connection opens. Here, every (re)start of a node opens a connection
//! from it to each peer and from each peer to it; each connection's hello
//! arrives once both ends are up, running, and can reach each other
//! (retried with backoff until then, dropped if an end goes down, as that
//! end's restart connects again). A starting node hears its peers through
//! the start-up hellos of `world.rs` instead.
//!
//! Everything here draws from a stream of its own, derived from the seed,
//! and a hello to a running node takes no turn of it, so the seed's main
//! stream (faults, clients) draws as before. A seed founded at LEVEL still
//! runs a little differently from before these hellos: a founding leader
//! that has heard every peer proposes a RaiseLevel right after its
//! Bootstrap (its table is at level 1 until that applies), one more entry,
//! as fencelockd's does.

use fencelock_raft::{Event as NodeEvent, NodeId};
use fencelock_types::LEVEL;

use crate::rng::Rng;
use crate::world::{Event, World};

/// The salt that sets the founding level's stream apart from the seed's main
/// one (the upgrades' stream has another, in `builds.rs`).
const FOUNDING_SALT: u64 = 0x666f_756e_6469_6e67;

/// How soon a connection's hello arrives, and how soon a connection that
/// could not open tries again, in ms.
const HELLO_MS: (u64, u64) = (10, 300);
const RECONNECT_MS: (u64, u64) = (50, 1_000);
/// How long an upgraded node stays down.
const UPGRADE_DOWN_MS: (u64, u64) = (200, 3_000);

/// The command level seed `seed` founds its cluster at: 1 or 2 for one
/// seed in eight each, else [`LEVEL`].
pub fn founding_level(seed: u64) -> u32 {
    match Rng::new(seed ^ FOUNDING_SALT).range(0, 8) {
        0 => 1,
        1 => 2,
        _ => LEVEL,
    }
}

impl World {
    /// `node`'s upgrade: from now on its hellos say [`LEVEL`]; a running
    /// node restarts for it (as a crash: what it had not synced is lost).
    pub(crate) fn upgrade(&mut self, node: usize) {
        self.nodes[node].build_level = LEVEL;
        if !self.stop(node) {
            self.note(&format!("{} upgraded while down", node + 1));
            return;
        }
        self.note(&format!("upgrade {}: restarts as a build of level {LEVEL}", node + 1));
        let down_ms = self.builds.rng.range(UPGRADE_DOWN_MS.0, UPGRADE_DOWN_MS.1);
        self.schedule(down_ms, Event::Restart(node));
    }

    /// `node` (re)started: its connections to and from each peer open.
    pub(crate) fn connect_peers(&mut self, node: usize) {
        for peer in (0..self.nodes.len()).filter(|peer| *peer != node) {
            for (to, from) in [(peer, node), (node, peer)] {
                let delay = self.builds.rng.range(HELLO_MS.0, HELLO_MS.1);
                self.schedule(delay, Event::Connect { to, from });
            }
        }
    }

    /// The connection from `from` to `to` opens with `from`'s hello, if
    /// both run and reach each other; else it tries again later, unless an
    /// end is down (its restart connects again).
    pub(crate) fn connect(&mut self, to: usize, from: usize) {
        let (Some(target), Some(peer)) = (self.nodes[to].node.as_ref(), self.nodes[from].node.as_ref())
        else {
            return;
        };
        let reachable = self.nodes[from].clock.paused(self.now_ms).is_none()
            && self.nodes[to].clock.paused(self.now_ms).is_none()
            && !self.network.is_cut(from, to)
            && !self.network.is_cut(to, from);
        if !reachable || target.is_starting() {
            let delay = self.builds.rng.range(RECONNECT_MS.0, RECONNECT_MS.1);
            self.schedule(delay, Event::Connect { to, from });
            return;
        }
        let report = self.hello_of(from, to, peer);
        let local_ms = self.nodes[to].clock.local_ms(self.now_ms);
        if let Some(target) = self.nodes[to].node.as_mut() {
            // No turn: the hello changes only what the node knows of its
            // peers' levels, which its next tick acts on.
            target.handle(local_ms, NodeEvent::PeerHello { from: NodeId(from as u64 + 1), report });
        }
    }

    /// What `from`'s hello to `to` says: the node's own report, with the
    /// level of the build `from` runs.
    pub(crate) fn hello_of(
        &self,
        from: usize,
        to: usize,
        peer: &fencelock_raft::Node<crate::world::Ask>,
    ) -> fencelock_raft::rejoin::PeerReport {
        let mut report = peer.hello_for(NodeId(to as u64 + 1));
        report.level = self.nodes[from].build_level;
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::builds::Builds;

    #[test]
    fn about_one_seed_in_eight_founds_at_each_older_level() {
        let mut count = [0u32; 4];
        for seed in 0..8_000 {
            count[founding_level(seed) as usize] += 1;
        }
        assert_eq!(count[0], 0);
        assert_eq!(count[1] + count[2] + count[3], 8_000);
        for older in [count[1], count[2]] {
            assert!((850..1_150).contains(&older), "{count:?}");
        }
    }

    #[test]
    fn only_a_cluster_founded_below_the_level_has_old_builds_and_they_upgrade_in_the_fault_phase() {
        assert!(Builds::draw(1, 5, LEVEL, 20_000).old.iter().all(Option::is_none));
        let mut old = 0;
        for seed in 0..200 {
            for founding in [1, 2] {
                for (level, at_ms) in Builds::draw(seed, 5, founding, 20_000).old.into_iter().flatten() {
                    old += 1;
                    assert!(level < LEVEL && at_ms < 20_000);
                    // A level-2 cluster has no build before levels in it.
                    assert!(founding == 1 || level == 2, "{founding} {level}");
                }
            }
        }
        assert!((800..1_200).contains(&old), "{old} old builds of 2,000 nodes");
    }
}
