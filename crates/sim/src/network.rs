//! The simulated network between nodes: delay with jitter (so messages
//! reorder), loss, duplication, and cuts (partitions, one-way links), each
//! drawn from the seed. Client connections are not cut (clients sit beside
//! the cluster); they see delay, and their connections drop.

use std::collections::{BTreeMap, BTreeSet};

use crate::rng::Rng;

#[derive(Debug, Default)]
pub struct Network {
    pub loss_ppm: u64,
    pub duplicate_ppm: u64,
    pub delay_min_ms: u64,
    pub delay_jitter_ms: u64,
    /// Directed links whose messages are dropped, by partition id.
    cut: BTreeMap<u64, BTreeSet<(usize, usize)>>,
    next_partition: u64,
}

impl Network {
    pub fn new(loss_ppm: u64, duplicate_ppm: u64, delay_min_ms: u64, delay_jitter_ms: u64) -> Network {
        Network { loss_ppm, duplicate_ppm, delay_min_ms, delay_jitter_ms, ..Network::default() }
    }

    /// Whether messages from `from` to `to` are dropped now.
    pub fn is_cut(&self, from: usize, to: usize) -> bool {
        self.cut.values().any(|cut| cut.contains(&(from, to)))
    }

    /// The delays of the copies of one message from `from` to `to` that
    /// arrive: none if the link is cut or the message is lost, two if it is
    /// duplicated.
    pub fn deliveries(&self, rng: &mut Rng, from: usize, to: usize) -> Vec<u64> {
        if self.is_cut(from, to) || rng.chance(self.loss_ppm) {
            return Vec::new();
        }
        let copies = if rng.chance(self.duplicate_ppm) { 2 } else { 1 };
        (0..copies).map(|_| self.delay(rng)).collect()
    }

    /// One message's delay.
    pub fn delay(&self, rng: &mut Rng) -> u64 {
        self.delay_min_ms + rng.range(0, self.delay_jitter_ms + 1)
    }

    /// Cuts `links` until [`Network::clear`] with the returned id.
    pub fn partition(&mut self, links: BTreeSet<(usize, usize)>) -> u64 {
        self.next_partition += 1;
        self.cut.insert(self.next_partition, links);
        self.next_partition
    }

    pub fn clear(&mut self, partition: u64) {
        self.cut.remove(&partition);
    }

    /// The heal: no cut, no loss, no duplication from here on.
    pub fn heal(&mut self) {
        self.cut.clear();
        self.loss_ppm = 0;
        self.duplicate_ppm = 0;
    }
}
