//! Expiry liveness: a lock whose holder stopped renewing it is freed within
//! its lease, stretched by the clocks' drift bound, plus [`SLACK_MS`], once
//! a leader is ready and the faults have healed. A lock that leaks (a ghost
//! never released, a lease a restarted leader never re-armed) stays held,
//! and a contending client waits for it in vain.
//!
//! A lock held under a session has no lease of its own: its session is
//! judged instead (refreshed by its keep-alives and by renewals of what it
//! holds), and must lapse, freeing all it holds, within its TTL likewise.
//!
//! Judged in the heal phase only: partitions, pauses, crashes and clock
//! jumps legitimately delay an expiry without bound.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_raft::AppliedEvent;
use fencelock_types::{FencingToken, Key};

/// Time beyond the lease for the leader's next scan, the Expire's commit
/// and apply.
pub const SLACK_MS: u64 = 1_000;

#[derive(Clone, Copy, Debug)]
struct Live {
    index: u64,
    refreshed_ms: u64,
    lease_ms: u64,
}

#[derive(Debug, Default)]
pub struct Check {
    drift_ppm_max: u64,
    /// Live locks: (key, token) → (the log index of the latest grant or
    /// renewal applied, the true time any node last applied one, and the
    /// lease of that latest entry). A lagging node that applies an older
    /// entry later does not bring back its lease: with owners' renewals that
    /// never shorten a lease, an older lease is often the shorter one.
    live: BTreeMap<(Key, FencingToken), Live>,
    /// Locks some node removed: a lagging or restarted node that applies
    /// their grant again later does not bring them back.
    removed: BTreeSet<(Key, FencingToken)>,
    /// Locks held under a session, and the session.
    in_session: BTreeMap<(Key, FencingToken), FencingToken>,
    /// Open sessions, as `live` (the lease their TTL).
    sessions: BTreeMap<FencingToken, Live>,
    /// Sessions some node ended.
    ended: BTreeSet<FencingToken>,
    /// The nodes that lead and are ready now, and since when.
    ready_leaders: BTreeMap<usize, u64>,
    judged: u64,
}

impl Check {
    pub fn new(drift_ppm_max: u64) -> Check {
        Check { drift_ppm_max, ..Check::default() }
    }

    /// Some node applied `event`, the entry at log `index`, at true time
    /// `now_ms`.
    pub fn applied(&mut self, index: u64, event: &AppliedEvent, now_ms: u64) {
        match event {
            AppliedEvent::Granted { key, token, session: Some(session), .. } => {
                if !self.removed.contains(&(key.clone(), *token)) {
                    self.in_session.insert((key.clone(), *token), *session);
                }
            }
            // A renew of what a session holds renews the session.
            AppliedEvent::Renewed { key, token, lease_ms }
                if self.in_session.contains_key(&(key.clone(), *token)) =>
            {
                let session = self.in_session[&(key.clone(), *token)];
                self.session_refreshed(index, session, lease_ms.get(), now_ms);
            }
            AppliedEvent::SessionOpened { session, ttl_ms }
            | AppliedEvent::SessionRenewed { session, ttl_ms } => {
                self.session_refreshed(index, *session, ttl_ms.get(), now_ms);
            }
            AppliedEvent::SessionEnded { session, .. } => {
                self.sessions.remove(session);
                self.ended.insert(*session);
            }
            AppliedEvent::Granted { key, token, lease_ms, .. }
            | AppliedEvent::Renewed { key, token, lease_ms } => {
                if self.removed.contains(&(key.clone(), *token)) {
                    return;
                }
                let lease_ms = lease_ms.get();
                let live = self.live.entry((key.clone(), *token)).or_insert(Live {
                    index,
                    refreshed_ms: now_ms,
                    lease_ms,
                });
                if index >= live.index {
                    live.index = index;
                    live.lease_ms = lease_ms;
                }
                live.refreshed_ms = live.refreshed_ms.max(now_ms);
            }
            AppliedEvent::Released { key, token }
            | AppliedEvent::Expired { key, token, .. }
            | AppliedEvent::Delayed { key, token, .. } => {
                self.live.remove(&(key.clone(), *token));
                self.in_session.remove(&(key.clone(), *token));
                self.removed.insert((key.clone(), *token));
            }
            AppliedEvent::DelayLifted { .. } | AppliedEvent::Proclaimed { .. } | AppliedEvent::Restored => {}
        }
    }

    /// `session` was opened or renewed with `ttl_ms` by the entry at
    /// `index`, which some node applied at `now_ms`.
    fn session_refreshed(&mut self, index: u64, session: FencingToken, ttl_ms: u64, now_ms: u64) {
        if self.ended.contains(&session) {
            return;
        }
        let live =
            self.sessions.entry(session).or_insert(Live { index, refreshed_ms: now_ms, lease_ms: ttl_ms });
        live.index = live.index.max(index);
        live.refreshed_ms = live.refreshed_ms.max(now_ms);
    }

    /// Node `node` became the ready leader at `now_ms`.
    pub fn leader_ready(&mut self, node: usize, now_ms: u64) {
        self.ready_leaders.insert(node, now_ms);
    }

    /// Node `node` stopped leading (a role change, a crash).
    pub fn leader_lost(&mut self, node: usize) {
        self.ready_leaders.remove(&node);
    }

    /// At `now_ms`, after the heal at `healed_ms`: every live lock must have
    /// been refreshed recently enough.
    pub fn check(&mut self, now_ms: u64, healed_ms: u64) -> Result<(), String> {
        // The latest of the ready leaders' starts: a leader that was lost
        // since does not count, and without one nothing expires.
        let Some(leader_ms) = self.ready_leaders.values().max().copied() else { return Ok(()) };
        let locks = self.live.iter().map(|((key, token), live)| (Some(key), *token, live));
        let sessions = self.sessions.iter().map(|(session, live)| (None, *session, live));
        for (key, token, Live { refreshed_ms, lease_ms, .. }) in locks.chain(sessions) {
            let since_ms = (*refreshed_ms).max(healed_ms).max(leader_ms);
            let stretched_ms = lease_ms * 1_000_000 / (1_000_000 - self.drift_ppm_max.min(900_000));
            let due_ms = since_ms + stretched_ms + SLACK_MS;
            if now_ms > due_ms {
                self.judged += 1;
                let what =
                    key.map_or_else(|| format!("session {token}"), |key| format!("{key} under {token}"));
                return Err(format!(
                    "{what}, last granted or renewed at {refreshed_ms} ms for {lease_ms} ms, \
                     is still held at {now_ms} ms (due by {due_ms} ms: a ready leader since {leader_ms} ms, \
                     healed at {healed_ms} ms)"
                ));
            }
        }
        self.judged += (self.live.len() + self.sessions.len()) as u64;
        Ok(())
    }

    /// How many times a live lock was held against its bound.
    pub fn judged(&self) -> u64 {
        self.judged
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use fencelock_types::LeaseMs;

    fn grant(token: u64, lease_ms: u64) -> AppliedEvent {
        AppliedEvent::Granted {
            key: key(),
            token: FencingToken::new(token).unwrap(),
            lease_ms: LeaseMs::new(lease_ms).unwrap(),
            existing: false,
            session: None,
        }
    }

    #[test]
    fn a_lock_nobody_renews_that_outlives_its_bound_is_caught() {
        let mut check = Check::new(0);
        check.applied(1, &grant(1, 1_000), 100);
        check.leader_ready(0, 50);
        assert!(check.check(2_100, 0).is_ok(), "within lease plus slack");
        let err = check.check(2_101, 0).unwrap_err();
        assert!(err.contains("still held"), "{err}");
    }

    #[test]
    fn renewals_releases_and_drift_push_the_bound() {
        let mut check = Check::new(500_000);
        check.leader_ready(0, 0);
        check.applied(1, &grant(1, 1_000), 0);
        // A slow clock may take twice the lease.
        assert!(check.check(2_900, 0).is_ok());
        let renew = AppliedEvent::Renewed {
            key: key(),
            token: FencingToken::new(1).unwrap(),
            lease_ms: LeaseMs::new(1_000).unwrap(),
        };
        check.applied(2, &renew, 2_500);
        assert!(check.check(5_400, 0).is_ok());
        check.applied(3, &AppliedEvent::Released { key: key(), token: FencingToken::new(1).unwrap() }, 5_450);
        assert!(check.check(100_000, 0).is_ok());
    }

    #[test]
    fn an_older_entry_applied_late_by_a_lagging_node_keeps_the_newer_lease() {
        let mut check = Check::new(0);
        check.leader_ready(0, 0);
        let renew = AppliedEvent::Renewed {
            key: key(),
            token: FencingToken::new(1).unwrap(),
            lease_ms: LeaseMs::new(4_000).unwrap(),
        };
        check.applied(1, &grant(1, 600), 0);
        check.applied(2, &renew, 100);
        // A lagging node applies the grant (index 1, 600 ms) at 3 s: the
        // lease is still the renewal's 4 s, from the latest application.
        check.applied(1, &grant(1, 600), 3_000);
        assert!(check.check(7_900, 0).is_ok(), "judged by the older, shorter lease");
        assert!(check.check(8_001, 0).is_err());
    }

    #[test]
    fn no_bound_before_a_leader_is_ready_or_before_the_heal() {
        let mut check = Check::new(0);
        check.applied(1, &grant(1, 1_000), 0);
        assert!(check.check(50_000, 0).is_ok(), "judged without a leader");
        check.leader_ready(0, 10_000);
        assert!(check.check(11_999, 0).is_ok());
        assert!(check.check(12_001, 0).is_err());
        let mut check = Check::new(0);
        check.applied(1, &grant(1, 1_000), 0);
        check.leader_ready(0, 0);
        assert!(check.check(20_000, 19_000).is_ok(), "the heal starts the bound");
    }

    #[test]
    fn a_lock_under_a_session_lives_as_long_as_the_session_is_kept_alive() {
        let mut check = Check::new(0);
        check.leader_ready(0, 0);
        let session = FencingToken::new(1).unwrap();
        let ttl_ms = LeaseMs::new(1_000).unwrap();
        check.applied(1, &AppliedEvent::SessionOpened { session, ttl_ms }, 0);
        let mut granted = grant(2, 1_000);
        if let AppliedEvent::Granted { session: of, .. } = &mut granted {
            *of = Some(session);
        }
        check.applied(2, &granted, 0);
        // Kept alive by keep-alives, then by a renew of the lock: the lock
        // has no lease of its own.
        check.applied(3, &AppliedEvent::SessionRenewed { session, ttl_ms }, 1_500);
        assert!(check.check(3_400, 0).is_ok(), "a lock under a live session is not due");
        let renew =
            AppliedEvent::Renewed { key: key(), token: FencingToken::new(2).unwrap(), lease_ms: ttl_ms };
        check.applied(4, &renew, 3_000);
        assert!(check.check(4_900, 0).is_ok());
        // No keep-alive since: the session is due, and named.
        let err = check.check(5_100, 0).unwrap_err();
        assert!(err.contains("session 1, last granted or renewed at 3000 ms"), "{err}");
        // Its end frees it and all it held.
        check.applied(
            5,
            &AppliedEvent::Expired { key: key(), token: FencingToken::new(2).unwrap(), proposer: None },
            5_200,
        );
        check.applied(5, &AppliedEvent::SessionEnded { session, expired: true, proposer: None }, 5_200);
        assert!(check.check(50_000, 0).is_ok());
        // A lagging node's replay brings back neither.
        check.applied(3, &AppliedEvent::SessionRenewed { session, ttl_ms }, 6_000);
        check.applied(2, &granted, 6_000);
        assert!(check.check(50_000, 0).is_ok());
    }

    #[test]
    fn a_leader_that_was_lost_does_not_count() {
        let mut check = Check::new(0);
        check.applied(1, &grant(1, 1_000), 0);
        check.leader_ready(2, 10);
        check.leader_lost(2);
        assert!(check.check(50_000, 0).is_ok(), "judged while no leader is ready");
        check.leader_ready(1, 40_000);
        assert!(check.check(41_999, 0).is_ok());
        assert!(check.check(42_001, 0).is_err());
    }
}
