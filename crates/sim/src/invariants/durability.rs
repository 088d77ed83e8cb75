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
            AppliedEvent::Released { key, token } | AppliedEvent::Expired { key, token, .. } => {
                self.removed.insert((key.clone(), *token));
            }
            AppliedEvent::Restored => {}
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
        let holds = |(key, token): &(Key, FencingToken)| {
            table.holder(key.as_bytes()).is_some_and(|lock| lock.token == *token)
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
