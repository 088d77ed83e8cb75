//! Warnings that repeat, rate-limited per kind and remote address: one
//! client script opening a connection a millisecond must not fill the disk
//! that holds the raft log with warnings. The first warning of a kind from
//! an address is logged; then at most one per [`THROTTLE_EVERY`], which
//! says how many it stands for.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// At most one warning of a kind from an address this often.
pub(crate) const THROTTLE_EVERY: Duration = Duration::from_secs(10);

/// Addresses remembered at once: past this, the oldest are forgotten (a
/// forgotten address logs again at once, which costs a line, not memory).
const REMEMBERED_MAX: usize = 4_096;

#[derive(Debug, Default)]
pub(crate) struct Throttle {
    last: HashMap<(&'static str, IpAddr), (Instant, u64)>,
}

impl Throttle {
    /// Whether a warning of `kind` about `remote` should be logged now:
    /// `Some(n)` with the `n` warnings it held back since the last one.
    pub(crate) fn admit(&mut self, kind: &'static str, remote: IpAddr, now: Instant) -> Option<u64> {
        if self.last.len() >= REMEMBERED_MAX && !self.last.contains_key(&(kind, remote)) {
            self.last.retain(|_, (at, _)| now.saturating_duration_since(*at) < THROTTLE_EVERY);
            if self.last.len() >= REMEMBERED_MAX {
                self.last.clear();
            }
        }
        match self.last.get_mut(&(kind, remote)) {
            Some((at, held)) if now.saturating_duration_since(*at) < THROTTLE_EVERY => {
                *held += 1;
                None
            }
            Some((at, held)) => {
                let suppressed = *held;
                *at = now;
                *held = 0;
                Some(suppressed)
            }
            None => {
                self.last.insert((kind, remote), (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_kind_and_address_per_period_with_the_count_it_stands_for() {
        let mut throttle = Throttle::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let start = Instant::now();
        assert_eq!(throttle.admit("refused", a, start), Some(0));
        for n in 1..=99 {
            assert_eq!(throttle.admit("refused", a, start + Duration::from_millis(n)), None);
        }
        // Another address, another kind: their own first line.
        assert_eq!(throttle.admit("refused", b, start), Some(0));
        assert_eq!(throttle.admit("closed", a, start), Some(0));
        // After the period, one line standing for the 99 held back.
        assert_eq!(throttle.admit("refused", a, start + THROTTLE_EVERY), Some(99));
        assert_eq!(throttle.admit("refused", a, start + THROTTLE_EVERY), None);
    }

    #[test]
    fn a_million_addresses_cost_bounded_memory() {
        let mut throttle = Throttle::default();
        let now = Instant::now();
        for n in 0..1_000_000u32 {
            throttle.admit("refused", IpAddr::from(n.to_be_bytes()), now);
            assert!(throttle.last.len() <= REMEMBERED_MAX);
        }
    }
}
