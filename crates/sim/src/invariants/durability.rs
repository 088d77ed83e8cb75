//! Nothing acknowledged is lost, judged grant by grant: a grant is its key,
//! its token and the log position that made it. Once the cluster has healed and converged,
//! every grant a client was told about is either still held under its token
//! or was removed by a Release or Expire that some node applied; every
//! acknowledged release stays released; every acknowledged renewal and
//! grant was applied; and the table's token counter is past every token a
//! client ever saw.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_fsm::LockTable;
use fencelock_raft::AppliedEvent;
use fencelock_types::{FencingToken, Key};

#[derive(Debug, Default)]
pub struct Check {
    /// Every grant applied: (key, token) → the entry indexes it was
    /// applied from (one, unless a token was issued twice).
    granted: BTreeMap<(Key, FencingToken), BTreeSet<u64>>,
    renewed: BTreeSet<(Key, FencingToken)>,
    removed: BTreeSet<(Key, FencingToken)>,
    acked_grants: BTreeSet<(Key, FencingToken)>,
    acked_renewals: BTreeSet<(Key, FencingToken)>,
    acked_releases: BTreeSet<(Key, FencingToken)>,
}

impl Check {
    pub fn applied(&mut self, index: u64, event: &AppliedEvent) {
        match event {
            AppliedEvent::Granted { key, token, existing: false, .. } => {
                self.granted.entry((key.clone(), *token)).or_default().insert(index);
            }
            AppliedEvent::Granted { .. } => {}
            AppliedEvent::Renewed { key, token, .. } => {
                self.renewed.insert((key.clone(), *token));
            }
            AppliedEvent::Released { key, token }
            | AppliedEvent::Expired { key, token, .. }
            | AppliedEvent::Delayed { key, token, .. } => {
                self.removed.insert((key.clone(), *token));
            }
            AppliedEvent::DelayLifted { .. }
            | AppliedEvent::Proclaimed { .. }
            | AppliedEvent::Restored
            | AppliedEvent::SessionOpened { .. }
            | AppliedEvent::SessionRenewed { .. }
            | AppliedEvent::SessionEnded { .. } => {}
        }
    }

    pub fn acked_grant(&mut self, key: &Key, token: FencingToken) {
        self.acked_grants.insert((key.clone(), token));
    }

    pub fn acked_renewal(&mut self, key: &Key, token: FencingToken) {
        self.acked_renewals.insert((key.clone(), token));
    }

    pub fn acked_release(&mut self, key: &Key, token: FencingToken) {
        self.acked_releases.insert((key.clone(), token));
    }

    pub fn acknowledgements(&self) -> usize {
        self.acked_grants.len() + self.acked_renewals.len() + self.acked_releases.len()
    }

    /// Checks the converged final table.
    pub fn finish(&self, table: &LockTable) -> Result<(), String> {
        // A lock held back by lock-delay still has its token here (its
        // Delayed change counts as its removal); a shared key, many.
        let holds = |(key, token): &(Key, FencingToken)| {
            table.holder(key.as_bytes()).is_some_and(|lock| lock.token == *token)
                || table.shared(key.as_bytes()).is_some_and(|shared| shared.holders.contains_key(token))
        };
        for grant in &self.acked_grants {
            match self.granted.get(grant).map(BTreeSet::len) {
                None | Some(0) => return Err(format!("acknowledged grant {grant:?} was never applied")),
                Some(1) => {}
                Some(_) => {
                    return Err(format!(
                        "acknowledged grant {grant:?} was applied from several log positions: {:?}",
                        self.granted.get(grant)
                    ))
                }
            }
            if !holds(grant) && !self.removed.contains(grant) {
                return Err(format!("acknowledged grant {grant:?} vanished without a release or expiry"));
            }
            if table.last_token() < Some(grant.1) {
                return Err(format!(
                    "table's last token {:?} is below acknowledged {grant:?}",
                    table.last_token()
                ));
            }
        }
        for renewal in &self.acked_renewals {
            if !self.renewed.contains(renewal) {
                return Err(format!("acknowledged renewal {renewal:?} was never applied"));
            }
        }
        for release in &self.acked_releases {
            if holds(release) || !self.removed.contains(release) {
                return Err(format!("acknowledged release {release:?} did not stick"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use fencelock_types::{Command, LeaseMs};

    fn release(n: u64) -> Command {
        Command::Release { key: key(), token: Some(token(n)), user: None }
    }

    #[test]
    fn an_acknowledged_grant_applied_from_two_log_positions_is_caught() {
        let mut check = Check::default();
        check.applied(3, &granted(1, false));
        check.applied(7, &granted(1, false));
        check.acked_grant(&key(), token(1));
        let err = check.finish(&table(vec![grant(b"a")])).unwrap_err();
        assert!(err.contains("was applied from several log positions"), "{err}");
        assert!(err.contains("{3, 7}"), "{err}");
    }

    #[test]
    fn one_grant_applied_on_several_nodes_replayed_and_retried_passes() {
        let mut check = Check::default();
        // Nodes 1, 2 and 3 apply it at index 3, and node 1 again after a
        // restart: one log position.
        for _ in 0..4 {
            check.applied(3, &granted(1, false));
        }
        // The holder's retry, answered with the same token from index 9.
        check.applied(9, &granted(1, true));
        check.acked_grant(&key(), token(1));
        check.acked_grant(&key(), token(1));
        assert_eq!(check.acknowledgements(), 1);
        check.finish(&table(vec![grant(b"a"), grant(b"a")])).unwrap();
    }

    #[test]
    fn an_acknowledged_release_that_did_not_stick_is_caught() {
        // Applied, yet the final table still holds the token.
        let mut check = Check::default();
        check.applied(1, &granted(1, false));
        check.applied(2, &released(1));
        check.acked_release(&key(), token(1));
        let err = check.finish(&table(vec![grant(b"a")])).unwrap_err();
        assert!(err.contains("acknowledged release (Key(\"k\"), FencingToken(1)) did not stick"), "{err}");
        // Never applied by any node.
        let mut check = Check::default();
        check.applied(1, &granted(1, false));
        check.acked_release(&key(), token(1));
        let err = check.finish(&LockTable::new()).unwrap_err();
        assert!(err.contains("did not stick"), "{err}");
    }

    #[test]
    fn an_acknowledged_release_followed_by_a_new_grant_passes() {
        let mut check = Check::default();
        check.applied(1, &granted(1, false));
        check.applied(2, &released(1));
        check.applied(3, &granted(2, false));
        // A lagging node applies the old release again.
        check.applied(2, &released(1));
        check.acked_grant(&key(), token(1));
        check.acked_release(&key(), token(1));
        check.acked_grant(&key(), token(2));
        check.finish(&table(vec![grant(b"a"), release(1), grant(b"b")])).unwrap();
    }

    #[test]
    fn an_acknowledged_grant_never_applied_or_vanished_is_caught_and_an_expired_one_is_not() {
        let mut check = Check::default();
        check.acked_grant(&key(), token(1));
        let err = check.finish(&table(vec![grant(b"a")])).unwrap_err();
        assert!(err.contains("acknowledged grant (Key(\"k\"), FencingToken(1)) was never applied"), "{err}");

        let mut check = Check::default();
        check.applied(1, &granted(1, false));
        check.acked_grant(&key(), token(1));
        let gone = table(vec![grant(b"a"), release(1)]);
        let err = check.finish(&gone).unwrap_err();
        assert!(err.contains("vanished without a release or expiry"), "{err}");

        check.applied(2, &AppliedEvent::Expired { key: key(), token: token(1), proposer: None });
        check.finish(&gone).unwrap();
    }

    #[test]
    fn acknowledged_shared_grants_still_held_pass() {
        let rw = Key::new(b"k-rw".to_vec()).unwrap();
        let mut check = Check::default();
        let mut held = LockTable::new();
        for (n, owner) in [(1, "a"), (2, "b")] {
            held.apply(Command::GrantShared {
                session: None,
                key: rw.clone(),
                lease_ms: LeaseMs::new(1_000).unwrap(),
                owner: fencelock_types::Owner::new(owner.as_bytes().to_vec()).unwrap(),
                share: fencelock_types::Share::Read,
            });
            let event = AppliedEvent::Granted {
                key: rw.clone(),
                token: token(n),
                lease_ms: LeaseMs::new(1_000).unwrap(),
                existing: false,
                session: None,
            };
            check.applied(n, &event);
            check.acked_grant(&rw, token(n));
        }
        check.finish(&held).unwrap();
        let err = check.finish(&LockTable::new()).unwrap_err();
        assert!(err.contains("vanished without a release or expiry"), "{err}");
    }

    #[test]
    fn a_token_counter_below_an_acknowledged_token_is_caught() {
        let mut check = Check::default();
        check.applied(1, &granted(1, false));
        check.applied(2, &released(1));
        check.applied(3, &granted(2, false));
        check.applied(4, &released(2));
        check.acked_grant(&key(), token(2));
        // Both locks gone, but the counter went back to 1.
        let err = check.finish(&table(vec![grant(b"a"), release(1)])).unwrap_err();
        assert!(err.contains("table's last token Some(FencingToken(1)) is below acknowledged"), "{err}");
        check.finish(&table(vec![grant(b"a"), release(1), grant(b"b"), release(2)])).unwrap();
    }

    #[test]
    fn an_acknowledged_renewal_never_applied_is_caught() {
        let mut check = Check::default();
        check.applied(1, &granted(1, false));
        check.acked_grant(&key(), token(1));
        check.acked_renewal(&key(), token(1));
        let held = table(vec![grant(b"a")]);
        let err = check.finish(&held).unwrap_err();
        assert!(
            err.contains("acknowledged renewal (Key(\"k\"), FencingToken(1)) was never applied"),
            "{err}"
        );
        check.applied(
            2,
            &AppliedEvent::Renewed { key: key(), token: token(1), lease_ms: LeaseMs::new(2_000).unwrap() },
        );
        check.finish(&held).unwrap();
    }
}
