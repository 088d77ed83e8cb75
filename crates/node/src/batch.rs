//! The lock service's next batch, on the ready leader: the requests ready
//! to go (client requests, its own expiries and ghost releases), decided
//! against the applied table and handed to consensus as entries of many
//! commands each, with the waiters a freed key is handed to in the same
//! entry. The service proposes through a [`Proposer`], raft-rs's door as
//! the replica opens it: it never sees raft-rs itself.

use super::*;

/// Commands and their request tags, on their way into one log entry.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    commands: Vec<Command>,
    tags: Vec<pb::RequestTag>,
}

/// The leader a service proposes as: its id and term, and raft-rs's door
/// for an entry (its context and data), which may refuse it.
pub(crate) struct Proposer<'a> {
    pub(crate) id: NodeId,
    pub(crate) term: u64,
    pub(crate) propose: &'a mut dyn FnMut(Vec<u8>, Vec<u8>) -> Result<(), String>,
}

impl LockService {
    /// On the ready leader, every scan interval: proposes an Expire for each
    /// lease this node's clock says is due.
    pub(crate) fn propose_expiries(&mut self) {
        let interval_ms = self.config.leases.expiry_scan_interval_ms;
        if self.leases.last_scan_ms.is_some_and(|last_ms| self.now_ms < last_ms.saturating_add(interval_ms)) {
            return;
        }
        self.leases.last_scan_ms = Some(self.now_ms);
        let due: Vec<(Key, FencingToken)> = self
            .leases
            .plain
            .due(self.now_ms)
            .filter(|(key, _)| !self.requests.is_expiring(key))
            .map(|(key, token)| (key.clone(), token))
            .collect();
        let shared_due: Vec<(Key, FencingToken)> = self
            .leases
            .shared
            .due(self.now_ms)
            .filter(|((key, _), _)| !self.requests.is_expiring(key))
            .map(|((key, _), token)| (key.clone(), token))
            .collect();
        // Sessions whose time is up: all they hold goes in one entry.
        let requests = &self.requests;
        self.leases.sessions_expiring.retain(|_, id| requests.contains(*id));
        self.leases.session_renewals.retain(|(id, _)| requests.contains(*id));
        let sessions_due: Vec<FencingToken> = self
            .leases
            .sessions
            .due(self.now_ms)
            .map(|(session, _)| *session)
            .filter(|session| !self.leases.sessions_expiring.contains_key(session))
            .collect();
        for session in sessions_due {
            if self.requests.internal() >= self.config.limits.internal_pending_max {
                break;
            }
            let id = self.internal_id();
            debug!(self.logger, "session due"; "session" => session.get(), "now_ms" => self.now_ms);
            let delays = self.config.leases.lock_delays.clone();
            self.leases.sessions_expiring.insert(session, id);
            self.submit_internal(id, vec![Command::ExpireSession { session, delays }]);
        }
        // One request per shared key, with an Expire for each of its
        // holders that is due (up to an entry's worth): a thousand readers
        // that die together leave in one entry, not one scan each. Keys in
        // the order their first holder fell due.
        let mut by_key: Vec<(Key, Vec<FencingToken>)> = Vec::new();
        let mut at: BTreeMap<Key, usize> = BTreeMap::new();
        for (key, token) in shared_due {
            match at.get(&key) {
                Some(&index) => {
                    let tokens = &mut by_key[index].1;
                    if tokens.len() < self.config.limits.entry_commands_max {
                        tokens.push(token);
                    }
                }
                None => {
                    at.insert(key.clone(), by_key.len());
                    by_key.push((key, vec![token]));
                }
            }
        }
        for (key, tokens) in by_key {
            if self.requests.internal() >= self.config.limits.internal_pending_max {
                break;
            }
            let id = self.internal_id();
            let delay_rule = self.config.lock_delay(key.as_bytes());
            let shared = self.table.shared(key.as_bytes());
            let commands = tokens
                .into_iter()
                .map(|token| {
                    // As for a plain lock: a holder held back is lifted, a
                    // live one held back if a rule covers its key.
                    let held_back = shared
                        .and_then(|shared| shared.holders.get(&token))
                        .is_some_and(|holder| holder.delayed);
                    let delay = if held_back { None } else { delay_rule };
                    debug!(self.logger, "shared lease due"; "key" => %key, "token" => token.get(),
                        "now_ms" => self.now_ms, "held_back" => held_back, "delay_ms" => delay.map(LeaseMs::get));
                    Command::Expire { key: key.clone(), token, delay }
                })
                .collect();
            self.submit_internal(id, commands);
        }
        for (key, token) in due {
            if self.requests.internal() >= self.config.limits.internal_pending_max {
                break;
            }
            let id = self.internal_id();
            // A lock held back by lock-delay is lifted (an Expire without a
            // delay); a live one is held back if a rule covers its key.
            let held_back = self.table.holder(key.as_bytes()).is_some_and(|lock| lock.delayed);
            let delay = if held_back { None } else { self.config.lock_delay(key.as_bytes()) };
            debug!(self.logger, "lease due"; "key" => %key, "token" => token.get(), "now_ms" => self.now_ms,
                "held_back" => held_back, "delay_ms" => delay.map(LeaseMs::get));
            self.submit_internal(id, vec![Command::Expire { key, token, delay }]);
        }
    }

    /// Proposes every ready request, many per entry.
    pub(crate) fn propose_ready_requests(&mut self, leader: &mut Proposer<'_>) {
        let mut batch = Batch::default();
        while let Some(id) = self.requests.pop_ready() {
            // Nothing else is in flight on these keys, so the applied table
            // (and this node's leases) is what this request will meet.
            if let Some(stale) = self.stale_expire(id) {
                debug!(self.logger, "expire no longer due"; "key" => %stale);
                self.finish(id, Ok(Response::Applied(Vec::new())));
                continue;
            }
            if self.stale_session_expiry(id) {
                debug!(self.logger, "session expiry no longer due");
                self.finish(id, Ok(Response::Applied(Vec::new())));
                continue;
            }
            if let Some(stale) = self.stale_ghost(id) {
                info!(self.logger, "ghost lock was granted or renewed again since: kept"; "key" => %stale);
                self.finish(id, Ok(Response::Applied(Vec::new())));
                continue;
            }
            let pending = self.requests.get(id).expect("a request ready to propose is pending");
            if let Some((key, holder_token)) = self.grant_conflict(&pending.commands, pending.admitted) {
                let max = self.config.limits.waiters_per_key_max;
                if pending.wait_until_ms.is_none() || self.turned_away_by_itself(&pending.commands) {
                    let error = match self.table.holder(key.as_bytes()).filter(|lock| lock.delayed) {
                        Some(lock) => {
                            let left_ms = self.held(&key, lock).remaining_ms;
                            RequestError::Delayed { key, holder_token, left_ms }
                        }
                        None => RequestError::Held { key, holder_token },
                    };
                    self.finish(id, Err(error));
                } else if self.requests.waiters_of(&key) >= max {
                    self.finish(id, Err(RequestError::TooManyWaiters { key, max }));
                } else {
                    let table = &self.table;
                    self.requests.wait_for(id, key, &|key, waiter| admits(table, key, waiter));
                }
                continue;
            }
            let new_locks = match self.quota_check(id, false) {
                Ok(new_locks) => new_locks,
                Err(err) => {
                    self.finish(id, Err(err));
                    continue;
                }
            };
            self.requests.count_new_locks(id, new_locks);
            let start = batch.commands.len();
            let removed = self.add_to_batch(&mut batch, id, leader.term);
            // Hand each lock this request frees to its first waiter in the
            // same entry: a hot-key handoff costs one commit. A waiter that
            // would break a quota is answered, and the next one asked.
            let mut handed = Vec::new();
            for key in removed {
                while let Some(waiter) = self.requests.first_waiter(&key) {
                    match self.quota_check(waiter, true) {
                        Ok(new_locks) => {
                            self.requests.hand_over(&key, id);
                            self.requests.count_new_locks(waiter, new_locks);
                            self.add_to_batch(&mut batch, waiter, leader.term);
                            handed.push((key, waiter));
                            break;
                        }
                        Err(err) => self.finish(waiter, Err(err)),
                    }
                }
            }
            self.hand_on_shared(&mut batch, start, id, &handed, leader.term);
            if batch.commands.len() >= self.config.limits.entry_commands_max {
                self.propose_entry(std::mem::take(&mut batch), leader);
            }
        }
        if !batch.commands.is_empty() {
            self.propose_entry(batch, leader);
        }
    }

    /// Hands the keys that the batch's commands from `start` on touch
    /// (request `id`'s, and those of the waiters `handed` its keys) on to
    /// as many more of their waiters as each key will admit once those
    /// commands apply: the readers queued behind a writer that leaves, or
    /// the waiters for permits freed together, go in this entry, not one
    /// entry each. Decided on a clone of the table (O(1): imbl) with those
    /// commands applied, as the table will decide: nothing else is in
    /// flight on these keys (their queues hold only this chain), and what
    /// is in flight elsewhere (a session's end) can only free them.
    pub(crate) fn hand_on_shared(
        &mut self,
        batch: &mut Batch,
        start: usize,
        id: RequestId,
        handed: &[(Key, RequestId)],
        term: u64,
    ) {
        // A plain lock's key has had its one waiter handed over (a hot
        // key's handoff costs no clone): only a shared key, or one whose
        // first waiter asks for a share, can take more.
        let mut keys: Vec<Key> = batch.commands[start..]
            .iter()
            .filter_map(Command::key)
            .filter(|key| {
                let first = self.requests.first_waiter(key).and_then(|waiter| self.requests.get(waiter));
                let wants_more = first.is_some_and(|waiter| {
                    self.table.shared(key.as_bytes()).is_some()
                        || waiter
                            .commands
                            .iter()
                            .any(|command| matches!(command, Command::GrantShared { .. }))
                });
                // A holder under a session may be held back or freed by that
                // session's end, in flight or earlier in this batch (a
                // CloseSession or the leader's ExpireSession goes through no
                // key queue): no guess then. Seed 132174523: an ExpireSession
                // held a permit back, so the release of it later in the same
                // entry freed nothing, and the waiter handed it was rejected.
                wants_more && !self.table.has_session_holder(key.as_bytes())
            })
            .cloned()
            .collect();
        if keys.is_empty() {
            return;
        }
        keys.sort();
        keys.dedup();
        let mut scratch = self.table.clone();
        for command in &batch.commands[start..] {
            scratch.apply(command.clone());
        }
        // What the chain adds: counted in flight, and held in `scratch`.
        let mut in_table: Vec<(Vec<u8>, bool)> = std::iter::once(id)
            .chain(handed.iter().map(|(_, waiter)| *waiter))
            .filter_map(|chained| self.requests.get(chained))
            .flat_map(|pending| pending.new_locks.iter().cloned())
            .collect();
        for key in keys {
            // Queued right behind the chain's last request on the key.
            let mut last = handed.iter().rev().find(|(of, _)| *of == key).map_or(id, |(_, waiter)| *waiter);
            while let Some(waiter) = self.requests.first_waiter(&key) {
                // Only a new place: an owner's retry (its grant Existing)
                // waits for an entry after the grant it repeats, so that a
                // ghost release of that grant, known by its index, never
                // takes the place the retry was told it holds.
                let takes_new_place = self.requests.get(waiter).is_some_and(|pending| {
                    admits(&scratch, &key, pending) && !repeats_a_grant(&scratch, &key, pending)
                });
                if !takes_new_place {
                    break;
                }
                match self.quota_check_in(&scratch, waiter, false, &in_table) {
                    Ok(new_locks) => {
                        self.requests.hand_over(&key, last);
                        in_table.extend(new_locks.iter().cloned());
                        self.requests.count_new_locks(waiter, new_locks);
                        let from = batch.commands.len();
                        self.add_to_batch(batch, waiter, term);
                        for command in &batch.commands[from..] {
                            scratch.apply(command.clone());
                        }
                        last = waiter;
                    }
                    Err(err) => self.finish(waiter, Err(err)),
                }
            }
        }
    }

    /// Moves request `id`'s commands into `batch`; returns the keys whose
    /// lock those commands will remove.
    pub(crate) fn add_to_batch(&mut self, batch: &mut Batch, id: RequestId, term: u64) -> Vec<Key> {
        let commands = self.requests.propose(id, term);
        for command in &commands {
            let renewed = match command {
                Command::RenewSession { session, .. } => Some(*session),
                Command::Renew { key, token, .. } => self.table.session_of(key.as_bytes(), *token),
                _ => None,
            };
            if let Some(session) = renewed {
                self.leases.session_renewals.push((id, session));
            }
        }
        let removed = commands
            .iter()
            .filter_map(|command| match command {
                Command::Release { key, token, user } => Some((key, *token, user.as_ref(), false)),
                // With a delay an Expire holds the key back: it frees nothing.
                Command::Expire { key, token, delay: None } => Some((key, Some(*token), None, true)),
                _ => None,
            })
            .filter(|(key, token, user, expire)| {
                // As the table will decide it: a release of another user's
                // lock is denied and frees nothing, and a lock held back by
                // lock-delay is freed only by force or by its lifting Expire.
                // A lock held under a session may be held back or freed by
                // that session's end, in flight or earlier in this batch (a
                // CloseSession or the leader's ExpireSession goes through no
                // key queue): no guess then; its waiter is woken when the
                // key frees. Seed 5871 of 5 nodes: an ExpireSession held k1
                // back, the release of it later in the same entry freed
                // nothing, and the waiter handed it was rejected.
                self.table.holder(key.as_bytes()).is_some_and(|lock| {
                    token.is_none_or(|token| token == lock.token)
                        && user.is_none_or(|user| lock.owner.is_of_user(user.as_bytes()))
                        && (!lock.delayed || *expire || token.is_none())
                        && lock.session.is_none()
                })
            })
            .map(|(key, ..)| key.clone())
            .collect();
        batch.tags.push(pb::RequestTag {
            request_id: id.0,
            commands: commands.len() as u32,
            ..Default::default()
        });
        batch.commands.extend(commands);
        removed
    }

    pub(crate) fn propose_entry(&mut self, batch: Batch, leader: &mut Proposer<'_>) {
        let ids: Vec<RequestId> = batch.tags.iter().map(|tag| RequestId(tag.request_id)).collect();
        let context =
            pb::EntryTags { proposer: leader.id.0, requests: batch.tags.into(), ..Default::default() }
                .write_to_bytes()
                .expect("encoding EntryTags into a Vec cannot fail");
        let n_commands = batch.commands.len() as u64;
        match (leader.propose)(context, encode_owned_batch(batch.commands)) {
            Ok(()) => {
                self.out.stats.entries_proposed += 1;
                self.out.stats.commands_proposed += n_commands;
                self.out.stats.requests_proposed += ids.len() as u64;
            }
            Err(err) => {
                debug!(self.logger, "proposal dropped"; "error" => %err, "requests" => ids.len());
                for id in ids {
                    self.finish(id, Err(RequestError::Dropped));
                }
            }
        }
    }
}
