//! A client told Granted or Renewed keeps its lock for its lease, measured
//! on the leader's clock: when the leader that proposed an Expire applies
//! it, its own clock must have passed the moment it applied that lock's last
//! grant or renewal plus the lease. An Expire that overtook a renewal fails
//! this. Judged per holder: a read-write lock's or a semaphore's holders
//! each have a lease of their own. A holder under a session has its
//! session's instead: the session's last open or renewal (a keep-alive, or
//! a renew of anything it holds) plus its TTL, to which both the session's
//! end and each of its holders' expiry are held.

use std::collections::BTreeMap;

use fencelock_fsm::LockTable;
use fencelock_raft::AppliedEvent;
use fencelock_types::{FencingToken, Key};

use super::Applied;

/// Per node, each lock's (key, token) and when it was last refreshed.
#[derive(Debug, Default)]
pub struct Check {
    refreshed: Vec<BTreeMap<(Key, FencingToken), Refreshed>>,
    /// Per node, each open session and when it was last renewed: what it
    /// holds has no lease of its own, the session's deadline is held to
    /// its TTL as a lock's to its lease.
    sessions: Vec<BTreeMap<FencingToken, Refreshed>>,
    /// Per node, the holders under a session, and the session.
    held_by: Vec<BTreeMap<(Key, FencingToken), FencingToken>>,
}

/// The node's clock when it applied a lock's last grant or renewal, the
/// lease, and whether that was a replay after a restart.
type Refreshed = (u64, u64, bool);

impl Check {
    pub fn new(nodes: usize) -> Check {
        Check {
            refreshed: vec![BTreeMap::new(); nodes],
            sessions: vec![BTreeMap::new(); nodes],
            held_by: vec![BTreeMap::new(); nodes],
        }
    }

    /// Node `node` installed a snapshot at `local_ms`, ending the turn with
    /// `table`. It cannot know when the locks in it were granted or renewed,
    /// so it gives each a full lease from now (`LeaseTracker::restore`):
    /// that, not what it applied before, is what it is held to. (A holder
    /// that asked again with a shorter lease may have shortened it; the
    /// snapshot carries the lease asked last.)
    pub fn restored(&mut self, node: usize, table: &LockTable, local_ms: u64) {
        let locks = table
            .list(b"", usize::MAX)
            .filter(|(_, lock)| lock.session.is_none())
            .map(|(key, lock)| ((key, lock.token), lock.lease_ms));
        let holders = table.list_shared(b"", usize::MAX).flat_map(|(key, shared)| {
            shared
                .holders
                .iter()
                .filter(|(_, holder)| holder.session.is_none())
                .map(move |(token, holder)| ((key, *token), holder.lease_ms))
        });
        self.sessions[node] =
            table.sessions().map(|(id, session)| (id, (local_ms, session.ttl_ms.get(), false))).collect();
        self.held_by[node] = table
            .sessions()
            .flat_map(|(id, session)| session.holds.iter().map(move |held| (held.clone(), id)))
            .collect();
        self.refreshed[node] = locks
            .chain(holders)
            .map(|((key, token), lease_ms)| ((key.clone(), token), (local_ms, lease_ms.get(), false)))
            .collect();
    }

    pub fn applied(&mut self, applied: &Applied<'_>) -> Result<(), String> {
        let refreshed = &mut self.refreshed[applied.node];
        let sessions = &mut self.sessions[applied.node];
        let held_by = &mut self.held_by[applied.node];
        let decided_here = |proposer: &Option<fencelock_raft::NodeId>| {
            *proposer == Some(fencelock_raft::NodeId(applied.node as u64 + 1)) && applied.is_leader
        };
        match applied.event {
            // Held under a session: its lease is the session's.
            AppliedEvent::Granted { key, token, session: Some(session), .. } => {
                held_by.insert((key.clone(), *token), *session);
            }
            // A renew of what a session holds renews the session.
            AppliedEvent::Renewed { key, token, lease_ms }
                if held_by.contains_key(&(key.clone(), *token)) =>
            {
                let session = held_by[&(key.clone(), *token)];
                sessions.insert(session, (applied.local_ms, lease_ms.get(), applied.replaying));
            }
            // Held under a session, expired (by its session's end, or by
            // anything else): held to the session's deadline.
            AppliedEvent::Expired { key, token, proposer }
            | AppliedEvent::Delayed { key, token, proposer, .. }
                if held_by.contains_key(&(key.clone(), *token)) =>
            {
                let session = held_by.remove(&(key.clone(), *token)).expect("held under a session");
                if let AppliedEvent::Delayed { delay_ms, .. } = applied.event {
                    refreshed
                        .insert((key.clone(), *token), (applied.local_ms, delay_ms.get(), applied.replaying));
                }
                if let Some((at_ms, ttl_ms, false)) = sessions.get(&session).copied() {
                    let due_ms = at_ms + ttl_ms;
                    if decided_here(proposer) && applied.local_ms < due_ms {
                        return Err(format!(
                            "node {} expired {key} (token {token}) under session {session} at {} ms on its clock, \
                             before {due_ms} ms",
                            applied.node + 1,
                            applied.local_ms
                        ));
                    }
                }
            }
            AppliedEvent::SessionOpened { session, ttl_ms }
            | AppliedEvent::SessionRenewed { session, ttl_ms } => {
                sessions.insert(*session, (applied.local_ms, ttl_ms.get(), applied.replaying));
            }
            AppliedEvent::SessionEnded { session, expired, proposer } => {
                let last = sessions.remove(session);
                if let Some((at_ms, ttl_ms, false)) = last.filter(|_| *expired) {
                    let due_ms = at_ms + ttl_ms;
                    if decided_here(proposer) && applied.local_ms < due_ms {
                        return Err(format!(
                            "node {} expired session {session} at {} ms on its clock, before {due_ms} ms",
                            applied.node + 1,
                            applied.local_ms
                        ));
                    }
                }
            }
            AppliedEvent::Granted { key, token, lease_ms, .. }
            | AppliedEvent::Renewed { key, token, lease_ms } => {
                refreshed
                    .insert((key.clone(), *token), (applied.local_ms, lease_ms.get(), applied.replaying));
            }
            AppliedEvent::Expired { key, token, proposer }
            | AppliedEvent::Delayed { key, token, proposer, .. }
            | AppliedEvent::DelayLifted { key, token, proposer, .. } => {
                // A lock-delay is held to its length as a lease is: the
                // Expire that lifts it comes no earlier on its proposer.
                let delay = match applied.event {
                    AppliedEvent::Delayed { delay_ms, .. } => Some(delay_ms.get()),
                    _ => None,
                };
                // A force-release lifts a delay at once: no clock to hold it to.
                let forced = matches!(applied.event, AppliedEvent::DelayLifted { forced: true, .. });
                // A replayed grant or renewal was first applied earlier, at a
                // time this node no longer knows: nothing to hold it to.
                let last = refreshed.remove(&(key.clone(), *token));
                if let Some(delay_ms) = delay {
                    refreshed.insert((key.clone(), *token), (applied.local_ms, delay_ms, applied.replaying));
                }
                if let Some((at_ms, lease_ms, false)) = last.filter(|_| !forced) {
                    let due_ms = at_ms + lease_ms;
                    // Checked where the Expire was decided: on its proposer,
                    // applying it while still leading (so with the clock it
                    // decided by, or later).
                    let decided_here = *proposer == Some(fencelock_raft::NodeId(applied.node as u64 + 1));
                    if decided_here && applied.is_leader && applied.local_ms < due_ms {
                        return Err(format!(
                            "node {} expired {key} (token {token}) at {} ms on its clock, before {due_ms} ms",
                            applied.node + 1,
                            applied.local_ms
                        ));
                    }
                }
            }
            AppliedEvent::Released { key, token } => {
                refreshed.remove(&(key.clone(), *token));
                held_by.remove(&(key.clone(), *token));
            }
            AppliedEvent::Proclaimed { .. } | AppliedEvent::Restored => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use fencelock_raft::NodeId;
    use fencelock_types::{Command, LeaseMs, Owner};

    fn granted(n: u64, lease_ms: u64, existing: bool) -> AppliedEvent {
        AppliedEvent::Granted {
            key: key(),
            token: token(n),
            lease_ms: LeaseMs::new(lease_ms).unwrap(),
            existing,
            session: None,
        }
    }

    fn renewed(n: u64, lease_ms: u64) -> AppliedEvent {
        AppliedEvent::Renewed { key: key(), token: token(n), lease_ms: LeaseMs::new(lease_ms).unwrap() }
    }

    /// An Expire proposed by node `proposer` (0-based).
    fn expired(n: u64, proposer: usize) -> AppliedEvent {
        AppliedEvent::Expired { key: key(), token: token(n), proposer: Some(NodeId(proposer as u64 + 1)) }
    }

    /// `event` as the leader, node 1, applied it at `local_ms`.
    fn leader(local_ms: u64, event: &AppliedEvent) -> Applied<'_> {
        Applied { node: 0, local_ms, is_leader: true, index: 1, replaying: false, event }
    }

    #[test]
    fn an_expire_before_the_lease_ran_out_on_its_proposer_is_caught() {
        let mut check = Check::new(3);
        check.applied(&leader(1_000, &granted(1, 5_000, false))).unwrap();
        let err = check.applied(&leader(5_999, &expired(1, 0))).unwrap_err();
        assert!(err.contains("node 1 expired k (token 1) at 5999 ms on its clock, before 6000 ms"), "{err}");
    }

    #[test]
    fn an_expire_that_overtook_a_renewal_is_caught() {
        let mut check = Check::new(3);
        check.applied(&leader(1_000, &granted(1, 5_000, false))).unwrap();
        check.applied(&leader(4_000, &renewed(1, 5_000))).unwrap();
        let err = check.applied(&leader(6_500, &expired(1, 0))).unwrap_err();
        assert!(err.contains("at 6500 ms on its clock, before 9000 ms"), "{err}");
        // A re-grant to the holder restarts the lease the same way.
        let mut check = Check::new(3);
        check.applied(&leader(1_000, &granted(1, 5_000, false))).unwrap();
        check.applied(&leader(3_000, &granted(1, 5_000, true))).unwrap();
        let err = check.applied(&leader(7_000, &expired(1, 0))).unwrap_err();
        assert!(err.contains("before 8000 ms"), "{err}");
    }

    #[test]
    fn each_holder_of_a_shared_key_is_held_to_its_own_lease() {
        let rw = || Key::new(b"k-rw".to_vec()).unwrap();
        let reader = |n| AppliedEvent::Granted {
            key: rw(),
            token: token(n),
            lease_ms: LeaseMs::new(5_000).unwrap(),
            existing: false,
            session: None,
        };
        let mut check = Check::new(3);
        check.applied(&leader(1_000, &reader(1))).unwrap();
        check.applied(&leader(3_000, &reader(2))).unwrap();
        // Reader 1's lease ran out; reader 2's, granted later, has not.
        let expire = |n| AppliedEvent::Expired { key: rw(), token: token(n), proposer: Some(NodeId(1)) };
        check.applied(&leader(6_000, &expire(1))).unwrap();
        let err = check.applied(&leader(7_000, &expire(2))).unwrap_err();
        assert!(
            err.contains("node 1 expired k-rw (token 2) at 7000 ms on its clock, before 8000 ms"),
            "{err}"
        );
    }

    #[test]
    fn a_renew_of_a_lock_under_a_session_renews_the_session() {
        let session = token(1);
        let ttl_ms = LeaseMs::new(5_000).unwrap();
        let under = AppliedEvent::Granted {
            key: key(),
            token: token(2),
            lease_ms: ttl_ms,
            existing: false,
            session: Some(session),
        };
        let ended = AppliedEvent::SessionEnded { session, expired: true, proposer: Some(NodeId(1)) };
        let history = |check: &mut Check| {
            check.applied(&leader(1_000, &AppliedEvent::SessionOpened { session, ttl_ms })).unwrap();
            check.applied(&leader(1_000, &under)).unwrap();
            // Renewed by a renew of its lock (not a keep-alive) at 4 s:
            // good until 9 s.
            check.applied(&leader(4_000, &renewed(2, 5_000))).unwrap();
        };
        let mut check = Check::new(3);
        history(&mut check);
        // Its lock expired, by the session's end, at 7 s: before 9 s.
        let err = check.applied(&leader(7_000, &expired(2, 0))).unwrap_err();
        assert!(
            err.contains("expired k (token 2) under session 1 at 7000 ms on its clock, before 9000 ms"),
            "{err}"
        );
        let mut check = Check::new(3);
        history(&mut check);
        let err = check.applied(&leader(7_000, &ended)).unwrap_err();
        assert!(err.contains("expired session 1 at 7000 ms on its clock, before 9000 ms"), "{err}");
        // After 9 s, both pass; a lock under a session has no lease of its
        // own (5 s from its grant at 1 s).
        let mut check = Check::new(3);
        history(&mut check);
        check.applied(&leader(9_000, &expired(2, 0))).unwrap();
        check.applied(&leader(9_000, &ended)).unwrap();
    }

    #[test]
    fn an_expire_after_a_renewal_that_extended_the_lease_passes() {
        let mut check = Check::new(3);
        check.applied(&leader(1_000, &granted(1, 5_000, false))).unwrap();
        check.applied(&leader(4_000, &renewed(1, 5_000))).unwrap();
        check.applied(&leader(9_000, &expired(1, 0))).unwrap();
        // Released, granted again: only the new grant's lease counts.
        check.applied(&leader(9_100, &granted(2, 5_000, false))).unwrap();
        check.applied(&leader(9_200, &AppliedEvent::Released { key: key(), token: token(2) })).unwrap();
        check.applied(&leader(9_300, &granted(3, 1_000, false))).unwrap();
        check.applied(&leader(10_300, &expired(3, 0))).unwrap();
    }

    #[test]
    fn an_early_expire_not_decided_here_or_after_a_replay_is_not_judged() {
        let mut check = Check::new(3);
        let grant = granted(1, 5_000, false);
        let expire = expired(1, 0);
        for node in 0..3 {
            let at = |local_ms, event| Applied {
                node,
                local_ms,
                is_leader: node == 0,
                index: 1,
                replaying: false,
                event,
            };
            check.applied(&at(1_000, &grant)).unwrap();
            // Node 1 proposed it; nodes 2 and 3 apply it by clocks that lag.
            if node != 0 {
                check.applied(&at(2_000, &expire)).unwrap();
            }
        }
        // The proposer applies it after losing the lead.
        check
            .applied(&Applied {
                node: 0,
                local_ms: 2_000,
                is_leader: false,
                index: 1,
                replaying: false,
                event: &expire,
            })
            .unwrap();
        // An Expire named by no proposer, or by another node.
        for expire in [AppliedEvent::Expired { key: key(), token: token(1), proposer: None }, expired(1, 2)] {
            check.applied(&leader(1_000, &grant)).unwrap();
            check.applied(&leader(2_000, &expire)).unwrap();
        }
        // The grant was replayed after a restart: its clock is not the one
        // it was decided by.
        check
            .applied(&Applied {
                node: 0,
                local_ms: 1_000,
                is_leader: true,
                index: 1,
                replaying: true,
                event: &grant,
            })
            .unwrap();
        check.applied(&leader(2_000, &expire)).unwrap();
    }

    #[test]
    fn a_restored_snapshot_gives_each_lock_a_full_lease_from_then() {
        let mut table = LockTable::new();
        table.apply(Command::Grant {
            session: None,
            key: key(),
            lease_ms: LeaseMs::new(5_000).unwrap(),
            owner: Owner::new(b"a".to_vec()).unwrap(),
            value: fencelock_types::Value::none(),
        });
        let mut check = Check::new(3);
        check.applied(&leader(1_000, &granted(1, 5_000, false))).unwrap();
        check.restored(0, &table, 10_000);
        let err = check.applied(&leader(12_000, &expired(1, 0))).unwrap_err();
        assert!(err.contains("before 15000 ms"), "{err}");
        check.restored(0, &table, 10_000);
        check.applied(&leader(15_000, &expired(1, 0))).unwrap();
    }
}
