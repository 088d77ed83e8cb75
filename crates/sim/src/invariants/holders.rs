//! What a client was promised: a client answered Granted (or Renewed) for
//! a request it sent at true time s with lease L has the key to itself
//! until s + L/(1+ρ), ρ the swarm's drift bound, unless it released first
//! (or was told the lock is gone). Checked against the first moment any
//! node applied a change of that key: a grant under another token, or a
//! release or expiry of the client's token, before then breaks the promise.
//! Forward clock jumps (outside the lease's assumptions) shorten it by the
//! sum of the jumps since it was made.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_raft::AppliedEvent;
use fencelock_types::{FencingToken, Key};

#[derive(Debug, Default)]
pub struct Check {
    drift_ppm_max: u64,
    /// Every forward clock jump so far: (true time, length).
    jumps: Vec<(u64, u64)>,
    /// Per client, what it believes it holds.
    holds: BTreeMap<usize, Hold>,
    /// The changes some node has applied: only the first application of
    /// each is judged (a lagging or restarted node applies it again later).
    seen: BTreeSet<(Key, FencingToken, bool)>,
    judged: u64,
}

#[derive(Debug)]
struct Hold {
    key: Key,
    token: FencingToken,
    valid_until_ms: u64,
    /// When the request that made (or last renewed) the promise was sent:
    /// clock jumps since count against it.
    since_ms: u64,
}

impl Check {
    pub fn new(drift_ppm_max: u64) -> Check {
        Check { drift_ppm_max, ..Check::default() }
    }

    /// How long a lease of `lease_ms` lasts in true time, at worst.
    fn lasts_ms(&self, lease_ms: u64) -> u64 {
        lease_ms * 1_000_000 / (1_000_000 + self.drift_ppm_max)
    }

    /// `client` was told it holds `key` under `token`, for a request sent
    /// at true time `sent_ms`.
    pub fn granted(
        &mut self,
        client: usize,
        key: &Key,
        token: FencingToken,
        sent_ms: u64,
        lease_ms: u64,
    ) -> Result<(), String> {
        let valid_until_ms = sent_ms + self.lasts_ms(lease_ms);
        for (other, hold) in &self.holds {
            if *other != client && hold.key == *key && hold.token == token {
                return Err(format!(
                    "clients {} and {} were both granted {key} under {token}",
                    other + 1,
                    client + 1
                ));
            }
        }
        self.holds.insert(client, Hold { key: key.clone(), token, valid_until_ms, since_ms: sent_ms });
        Ok(())
    }

    /// `client` was told its lock was renewed, for a request sent at
    /// `sent_ms`.
    pub fn renewed(&mut self, client: usize, key: &Key, token: FencingToken, sent_ms: u64, lease_ms: u64) {
        let until_ms = sent_ms + self.lasts_ms(lease_ms);
        if let Some(hold) = self.holds.get_mut(&client).filter(|hold| hold.key == *key && hold.token == token)
        {
            if until_ms > hold.valid_until_ms {
                hold.valid_until_ms = until_ms;
                hold.since_ms = sent_ms;
            }
        }
    }

    /// `client` lets go of what it holds (it is sending a release, or was
    /// told its lock is gone).
    pub fn released(&mut self, client: usize) {
        self.holds.remove(&client);
    }

    /// A node's clock jumped forward by `jump_ms` at true time `now_ms`.
    pub fn clock_jumped(&mut self, now_ms: u64, jump_ms: u64) {
        self.jumps.push((now_ms, jump_ms));
    }

    /// Some node applied `event` at true time `now_ms`.
    pub fn applied(&mut self, event: &AppliedEvent, now_ms: u64) -> Result<(), String> {
        let (key, token, removed) = match event {
            AppliedEvent::Granted { key, token, existing: false, .. } => (key, *token, false),
            // Held back by lock-delay, a lock is its holder's no more.
            AppliedEvent::Released { key, token }
            | AppliedEvent::Expired { key, token, .. }
            | AppliedEvent::Delayed { key, token, .. } => (key, *token, true),
            _ => return Ok(()),
        };
        if !self.seen.insert((key.clone(), token, removed)) {
            return Ok(());
        }
        for (client, hold) in &self.holds {
            if hold.key != *key || (hold.token == token) != removed {
                continue;
            }
            self.judged += 1;
            let allowance: u64 =
                self.jumps.iter().filter(|(at, _)| *at >= hold.since_ms).map(|(_, jump)| jump).sum();
            if now_ms + allowance < hold.valid_until_ms {
                let what = if removed { "removed" } else { "granted to another under" };
                return Err(format!(
                    "client {} was promised {key} under {} until {} ms, but it was {what} token {token} at {now_ms} ms",
                    client + 1,
                    hold.token,
                    hold.valid_until_ms
                ));
            }
        }
        Ok(())
    }

    /// How many promises were checked against a change of their key.
    pub fn judged(&self) -> u64 {
        self.judged
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use fencelock_types::LeaseMs;

    #[test]
    fn a_ghost_release_under_a_promised_holder_is_caught() {
        let mut check = Check::new(0);
        check.granted(0, &key(), token(3), 1_000, 30_000).unwrap();
        let release = AppliedEvent::Released { key: key(), token: token(3) };
        let err = check.applied(&release, 1_050).unwrap_err();
        assert!(err.contains("client 1 was promised k under 3"), "{err}");
    }

    #[test]
    fn a_grant_to_another_before_the_lease_ran_out_is_caught_and_after_is_not() {
        let mut check = Check::new(100_000);
        check.granted(0, &key(), token(3), 0, 11_000).unwrap();
        let other = AppliedEvent::Granted {
            key: key(),
            token: token(4),
            lease_ms: LeaseMs::new(1_000).unwrap(),
            existing: false,
            session: None,
        };
        assert!(check.applied(&other, 9_999).is_err());
        let mut check = Check::new(100_000);
        check.granted(0, &key(), token(3), 0, 11_000).unwrap();
        assert!(check.applied(&other, 10_000).is_ok());
        assert_eq!(check.judged(), 1);
    }

    #[test]
    fn a_release_the_client_sent_itself_and_renewals_are_honoured() {
        let mut check = Check::new(0);
        check.granted(0, &key(), token(3), 0, 1_000).unwrap();
        check.renewed(0, &key(), token(3), 900, 1_000);
        let expire = AppliedEvent::Expired { key: key(), token: token(3), proposer: None };
        assert!(check.applied(&expire, 1_500).is_err(), "a renewal did not extend the promise");
        let mut check = Check::new(0);
        check.granted(0, &key(), token(3), 0, 1_000).unwrap();
        check.released(0);
        assert!(check.applied(&AppliedEvent::Released { key: key(), token: token(3) }, 10).is_ok());
    }

    #[test]
    fn only_the_first_application_of_a_change_is_judged() {
        let mut check = Check::new(0);
        let release = AppliedEvent::Released { key: key(), token: token(3) };
        check.applied(&release, 10).unwrap();
        check.granted(0, &key(), token(3), 20, 1_000).unwrap();
        // A lagging node applies the old release again: not a new change.
        assert!(check.applied(&release, 30).is_ok());
    }

    #[test]
    fn clock_jumps_shorten_the_promise() {
        let mut check = Check::new(0);
        check.granted(0, &key(), token(3), 0, 1_000).unwrap();
        check.clock_jumped(10, 500);
        let expire = AppliedEvent::Expired { key: key(), token: token(3), proposer: None };
        assert!(check.applied(&expire, 600).is_ok());
    }

    #[test]
    fn two_clients_told_the_same_token_is_caught() {
        let mut check = Check::new(0);
        check.granted(0, &key(), token(3), 0, 1_000).unwrap();
        assert!(check.granted(1, &key(), token(3), 5, 1_000).is_err());
    }
}
