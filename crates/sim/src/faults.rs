//! The faults of a run: the mix drawn from the seed (swarm testing), and
//! carrying each one out: partitions, crashes (between two writes of a
//! turn, too, and with a lost disk), pauses, clock jumps; then the heal.

use std::collections::BTreeSet;

use crate::disk::SimDisk;
use crate::world::{Event, World};

impl World {
    pub(crate) fn inject_fault(&mut self) -> Result<(), String> {
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
                let id = self.network.partition(cut);
                let lasts = self.rng.range(200, 4_000);
                self.schedule(lasts, Event::ClearPartition(id));
                self.note(&format!("partition {id} shape {shape} around {}", node + 1));
            }
            1 => {
                if self.swarm.crash_mid_turn && self.nodes[node].node.is_some() {
                    let writes = self.rng.range(0, 3) as u32;
                    self.nodes[node].disk.crash_after(writes);
                    self.note(&format!("disk of {} dies after {writes} writes", node + 1));
                } else {
                    self.crash(node);
                }
            }
            2 => {
                let pause = self.rng.range(100, 3_000);
                self.nodes[node].clock.paused_until_ms = self.now_ms + pause;
                self.note(&format!("pause {} for {pause}", node + 1));
            }
            _ => {
                let jump = self.rng.range(50, 2_000);
                self.nodes[node].clock.jump_ms += jump;
                self.checker.clock_jumped(self.now_ms, jump);
                self.note(&format!("clock of {} jumps {jump}", node + 1));
            }
        }
        Ok(())
    }

    /// The node dies (its unsynced writes and its client connections with
    /// it), and with the swarm's odds its whole disk too; it restarts later.
    pub(crate) fn crash(&mut self, node: usize) {
        if !self.stop(node) {
            return;
        }
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

    /// The node's process ends, taking its unsynced writes and its client
    /// connections with it; false if it was down already.
    pub(crate) fn stop(&mut self, node: usize) -> bool {
        if self.nodes[node].node.take().is_none() {
            return false;
        }
        self.nodes[node].disk.crash();
        self.nodes[node].wake_at = None;
        self.checker.expiry.leader_lost(node);
        for conn in std::mem::take(&mut self.nodes[node].conns) {
            self.connection_reset(conn);
        }
        true
    }

    pub(crate) fn heal(&mut self) -> Result<(), String> {
        self.healed = true;
        self.healed_at = Some(self.now_ms);
        self.note("heal");
        self.network.heal();
        self.swarm.abandon_ppm = 0;
        self.swarm.reset_ppm = 0;
        for node in 0..self.nodes.len() {
            let was_paused = self.nodes[node].clock.paused(self.now_ms).is_some();
            self.nodes[node].clock.paused_until_ms = 0;
            self.nodes[node].disk.disarm();
            if self.nodes[node].node.is_none() {
                if self.nodes[node].may_start() {
                    self.start_node(node)?;
                }
            } else if was_paused {
                // A paused node's turn and fsync were put off to the end of
                // its pause: it resumes now, so they go now (seed
                // 2774141204: a leader paused past the heal could not apply
                // its own entry, nor expire the lease it granted, until the
                // old pause's end).
                if self.nodes[node].persist_scheduled {
                    self.schedule(0, Event::Persist(node));
                }
                self.set_wake(node, self.now_ms);
            }
        }
        Ok(())
    }
}
