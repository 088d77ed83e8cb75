//! Each node's monotonic clock, as a function of the simulation's true
//! time: its own start, a drift within the swarm's bound, forward jumps, and
//! pauses (a stopped process: it reads, syncs and sends nothing meanwhile).

/// One node's clock.
#[derive(Clone, Debug)]
pub struct NodeClock {
    /// Where this node's clock starts: clocks need not agree.
    pub skew_ms: u64,
    /// Parts per million it runs fast (positive) or slow.
    pub drift_ppm: i64,
    /// Forward jumps so far.
    pub jump_ms: u64,
    /// True time until which the node is paused.
    pub paused_until_ms: u64,
}

impl NodeClock {
    pub fn new(skew_ms: u64, drift_ppm: i64) -> NodeClock {
        NodeClock { skew_ms, drift_ppm, jump_ms: 0, paused_until_ms: 0 }
    }

    /// The node's clock at true time `now_ms`.
    pub fn local_ms(&self, now_ms: u64) -> u64 {
        let scaled = i128::from(now_ms) * i128::from(1_000_000 + self.drift_ppm) / 1_000_000;
        self.skew_ms + scaled as u64 + self.jump_ms
    }

    /// The first true time at or after `now_ms` at which the node's clock
    /// reads at least `local_ms`.
    pub fn true_ms_at(&self, local_ms: u64, now_ms: u64) -> u64 {
        let offset = self.skew_ms + self.jump_ms;
        if local_ms <= offset {
            return now_ms;
        }
        let rate = i128::from(1_000_000 + self.drift_ppm);
        let needed = i128::from(local_ms - offset) * 1_000_000;
        let mut at = ((needed + rate - 1) / rate) as u64;
        // Integer rounding in `local_ms`: step until it really reads that.
        while self.local_ms(at) < local_ms {
            at += 1;
        }
        at.max(now_ms)
    }

    /// `Some(delay)` while the node is paused at true time `now_ms`.
    pub fn paused(&self, now_ms: u64) -> Option<u64> {
        (self.paused_until_ms > now_ms).then(|| self.paused_until_ms - now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn true_time_at_a_reading_is_the_first_that_shows_it() {
        for drift_ppm in [-500_000, -50_000, 0, 1_000, 500_000] {
            let mut clock = NodeClock::new(123_456, drift_ppm);
            clock.jump_ms = 77;
            for local in [200_000, 200_001, 250_000, 999_999] {
                let at = clock.true_ms_at(local, 0);
                assert!(clock.local_ms(at) >= local, "drift {drift_ppm}: {at} reads {}", clock.local_ms(at));
                assert!(
                    at == 0 || clock.local_ms(at - 1) < local,
                    "drift {drift_ppm}: {at} is not the first"
                );
            }
            assert_eq!(clock.true_ms_at(5, 42), 42, "a reading already past is now");
        }
    }
}
