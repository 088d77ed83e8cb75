//! [`Lease`]: one held lock's lease as the client may count on it.
//!
//! `docs/leases.md`: a lock granted (or renewed) by a request *sent* at `s`
//! for `lease` is held at least until real time `s + lease / (1 + ρ)` when
//! every node's clock runs within ±ρ of real time, and a client whose own
//! clock drifts as much may count on it until its clock reads
//! `s + lease × (1 − ρ) / (1 + ρ)`. That is [`Drift::usable`]. The client
//! renews every third of the lease, and counts a lock lost once a renewal is
//! refused or the usable part of a lease passed with no renewal answered.

use std::time::{Duration, Instant};

/// ρ, the most a clock's rate may differ from real time, as a fraction:
/// `0.01` is 10 ms a second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Drift(f64);

/// The default ρ: 1 %, a margin of about 2 % of each lease. Ordinary
/// hardware drifts far less than 0.1 % (`docs/leases.md`), so this leaves
/// room for a slewing NTP daemon and a virtual machine's clock.
pub const DEFAULT_DRIFT: Drift = Drift(0.01);

// ρ is finite (never NaN): `Drift::new` sees to it.
impl Eq for Drift {}

impl Default for Drift {
    fn default() -> Drift {
        DEFAULT_DRIFT
    }
}

impl Drift {
    /// ρ as a fraction in `[0, 0.5)`; anything else (negative, NaN, so large
    /// that no lease would be usable) is refused with a sentence.
    pub fn new(rho: f64) -> Result<Drift, String> {
        if rho.is_finite() && (0.0..0.5).contains(&rho) {
            Ok(Drift(rho))
        } else {
            Err(format!("a clock drift of {rho} is not a fraction from 0 up to 0.5 (0.01 is 1 %)"))
        }
    }

    pub fn rho(self) -> f64 {
        self.0
    }

    /// How much of `lease`, counted from the request's send time, the client
    /// may count on: `lease × (1 − ρ) / (1 + ρ)`, rounded down to the
    /// microsecond.
    pub fn usable(self, lease: Duration) -> Duration {
        let micros = lease.as_micros() as f64 * (1.0 - self.0) / (1.0 + self.0);
        // In range: below the lease, which fits a Duration.
        Duration::from_micros(micros.floor() as u64).min(lease)
    }
}

/// The least time between two renewals, so that a tiny lease cannot turn a
/// renewer into a busy loop.
pub const ROUND_MIN: Duration = Duration::from_millis(10);

/// How often a lock with `lease` is renewed: a third of it.
pub fn renew_every(lease: Duration) -> Duration {
    (lease / 3).max(ROUND_MIN)
}

/// After a failed renewal attempt, how long until the next: a tenth of the
/// lease, so that a failing cluster is not hammered.
pub fn retry_every(lease: Duration) -> Duration {
    (lease / 10).max(ROUND_MIN)
}

/// Whether a lock granted by a request sent at `sent` should be renewed at
/// once, at `now`, before it is handed to the caller: half of its usable
/// lease or more is gone. That is an acquire that waited in the leader's
/// queue: the server's lease starts when it grants, but all the client can
/// prove is the send time, so it starts a lease it can count on with a
/// renewal (whose send time is now).
pub fn needs_fresh_start(sent: Instant, lease: Duration, drift: Drift, now: Instant) -> bool {
    now.saturating_duration_since(sent) >= drift.usable(lease) / 2
}

/// One held lock's lease, on the client's clock. See the module doc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    lease: Duration,
    drift_usable: Duration,
    /// The end of the usable part of the last lease granted or renewed.
    valid_until: Instant,
    /// When the next renewal is due.
    renew_at: Instant,
    lost: Option<String>,
}

impl Lease {
    /// A lock granted for `lease` by a request sent at `sent`.
    pub fn granted(sent: Instant, lease: Duration, drift: Drift) -> Lease {
        let usable = drift.usable(lease);
        Lease {
            lease,
            drift_usable: usable,
            valid_until: sent + usable,
            renew_at: sent + renew_every(lease),
            lost: None,
        }
    }

    /// The lease each renewal asks for.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Marks the lock lost at `now` if its usable lease has run out; true
    /// once it is lost, for whatever reason.
    pub fn check(&mut self, now: Instant) -> bool {
        if self.lost.is_none() && now >= self.valid_until {
            self.lost = Some("the lease ran out before a renewal succeeded".to_owned());
        }
        self.lost.is_some()
    }

    /// Why it was lost, if it was (as of the last [`Lease::check`]).
    pub fn lost_reason(&self) -> Option<&str> {
        self.lost.as_deref()
    }

    /// The time the client may still count on the lock at `now`: zero once
    /// lost.
    pub fn time_left(&self, now: Instant) -> Duration {
        if self.lost.is_some() {
            return Duration::ZERO;
        }
        self.valid_until.saturating_duration_since(now)
    }

    /// When the usable lease runs out unless renewed.
    pub fn valid_until(&self) -> Instant {
        self.valid_until
    }

    /// When the next renewal is due.
    pub fn renew_at(&self) -> Instant {
        self.renew_at
    }

    /// A renewal attempt starts at `now`: unless it succeeds, the next is
    /// due a little later (not at once).
    pub fn renewing(&mut self, now: Instant) {
        self.renew_at = now + retry_every(self.lease);
    }

    /// A renewal sent at `sent` was answered: renewed for `lease`. A lock
    /// already lost stays lost: its holder may have acted on that.
    pub fn renewed(&mut self, sent: Instant, lease: Duration, drift: Drift) {
        if self.lost.is_none() {
            self.drift_usable = drift.usable(lease);
            self.valid_until = self.valid_until.max(sent + self.drift_usable);
            self.renew_at = sent + renew_every(lease);
        }
    }

    /// A renewal was refused, or the lock was otherwise lost: `reason` says
    /// how. The first reason stays; later ones follow from it.
    pub fn lose(&mut self, reason: String) {
        if self.lost.is_none() {
            self.lost = Some(reason);
        }
    }

    /// How long a renewal attempt may retry at `now`: until the usable lease
    /// runs out (nothing is left to save after that), at most `retry_for`.
    pub fn renew_budget(&self, now: Instant, retry_for: Duration) -> Duration {
        self.valid_until.saturating_duration_since(now).min(retry_for)
    }
}

#[cfg(test)]
mod fresh_start_tests {
    use super::*;

    #[test]
    fn a_grant_after_a_long_wait_is_renewed_before_it_is_used() {
        let sent = Instant::now();
        let lease = Duration::from_secs(10);
        let drift = Drift::new(0.0).unwrap();
        assert!(!needs_fresh_start(sent, lease, drift, sent + Duration::from_millis(100)));
        assert!(!needs_fresh_start(sent, lease, drift, sent + Duration::from_millis(4_999)));
        assert!(needs_fresh_start(sent, lease, drift, sent + Duration::from_secs(5)));
        assert!(needs_fresh_start(sent, lease, drift, sent + Duration::from_secs(30)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_usable_lease_keeps_the_margin_of_docs_leases() {
        let drift = Drift::new(0.01).unwrap();
        // 10 s × 0.99 / 1.01 = 9.80198 s.
        assert_eq!(drift.usable(Duration::from_secs(10)), Duration::from_micros(9_801_980));
        assert_eq!(Drift::new(0.0).unwrap().usable(Duration::from_secs(10)), Duration::from_secs(10));
        for bad in [-0.1, 0.5, 3.0, f64::NAN, f64::INFINITY] {
            assert!(Drift::new(bad).is_err(), "{bad}");
        }
        // Never more than the lease, whatever ρ.
        for rho in [0.0, 0.001, 0.2, 0.499] {
            for lease_ms in [0, 1, 7, 2_000, 86_400_000] {
                let lease = lease_ms * MS;
                assert!(Drift::new(rho).unwrap().usable(lease) <= lease);
            }
        }
    }

    #[test]
    fn a_lease_is_lost_when_its_usable_part_runs_out_unrenewed_and_counts_from_the_send() {
        let sent = Instant::now();
        let drift = Drift::new(0.01).unwrap();
        let mut lease = Lease::granted(sent, Duration::from_secs(3), drift);
        assert_eq!(lease.renew_at(), sent + Duration::from_secs(1));
        assert_eq!(lease.time_left(sent), drift.usable(Duration::from_secs(3)));
        let end = sent + drift.usable(Duration::from_secs(3));
        assert!(!lease.check(end - MS));
        assert!(lease.check(end));
        assert_eq!(lease.time_left(end - MS), Duration::ZERO);
        assert_eq!(lease.lost_reason(), Some("the lease ran out before a renewal succeeded"));
        // Renewed too late: it stays lost.
        lease.renewed(end, Duration::from_secs(3), drift);
        assert!(lease.check(end + MS));
    }

    #[test]
    fn a_renewal_extends_from_its_send_time_and_never_shortens() {
        let sent = Instant::now();
        let drift = Drift::default();
        let mut lease = Lease::granted(sent, Duration::from_secs(3), drift);
        lease.renewing(sent + Duration::from_secs(1));
        assert_eq!(lease.renew_at(), sent + Duration::from_millis(1_300));
        lease.renewed(sent + Duration::from_secs(1), Duration::from_secs(3), drift);
        assert_eq!(lease.valid_until(), sent + Duration::from_secs(1) + drift.usable(Duration::from_secs(3)));
        assert_eq!(lease.renew_at(), sent + Duration::from_secs(2));
        // An older renewal's answer, arriving late, takes nothing away.
        lease.renewed(sent, Duration::from_secs(3), drift);
        assert_eq!(lease.valid_until(), sent + Duration::from_secs(1) + drift.usable(Duration::from_secs(3)));
        lease.lose("renewal refused".into());
        lease.lose("later".into());
        assert!(lease.check(sent));
        assert_eq!(lease.lost_reason(), Some("renewal refused"));
        assert_eq!(lease.time_left(sent), Duration::ZERO);
    }

    #[test]
    fn renewals_are_paced_by_the_lease_with_a_floor() {
        assert_eq!(renew_every(Duration::from_secs(30)), Duration::from_secs(10));
        assert_eq!(renew_every(Duration::from_millis(3)), ROUND_MIN);
        assert_eq!(retry_every(Duration::from_secs(30)), Duration::from_secs(3));
        let now = Instant::now();
        let lease = Lease::granted(now, Duration::from_secs(30), Drift::default());
        assert_eq!(lease.renew_budget(now, Duration::from_secs(5)), Duration::from_secs(5));
        assert_eq!(lease.renew_budget(now + Duration::from_secs(60), Duration::from_secs(5)), Duration::ZERO);
    }
}
