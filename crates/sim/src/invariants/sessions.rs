//! Sessions, on every node and in what their clients were promised.
//!
//! On each node, after each change (membership tracked from the applied
//! changes, `Granted { session }`, not from the table's own index):
//! - a session's end frees all it held: each of its holders is reported
//!   gone (Released, Expired or Delayed) before its SessionEnded, in the
//!   same entry, and after the turn no holder of the table names it, none
//!   of those (key, token) still holds (held back by lock-delay at most),
//!   and the session is not open;
//! - every holder that names a session names an open session of the same
//!   owner, and each open session's holdings are exactly the holders that
//!   name it, and the ones the applied changes put under it; a grant
//!   under a session comes only while it is open.
//!
//! Among clients, as [`super::holders`] judges plain locks: a client told
//! its session is alive (opened or kept alive, by a keep-alive or a renew
//! of a lock under it) for a request sent at true time s with TTL T keeps
//! it, and every lock it was granted under it, until s + T/(1+ρ), unless it
//! closed the session or let the lock go first. Judged against the first
//! moment any node applied the session's end or a lock's removal; and a
//! client answered NoSession before then was refused wrongly. Forward clock
//! jumps shorten the promise by their sum since it was made.

use std::collections::{BTreeMap, BTreeSet};

use fencelock_fsm::LockTable;
use fencelock_raft::AppliedEvent;
use fencelock_types::{FencingToken, Key, Owner};

use super::Applied;

/// What one node holds under each session, as its applied changes said.
#[derive(Debug, Default, Clone)]
struct NodeView {
    /// The open sessions and the (key, token) each holds.
    members: BTreeMap<FencingToken, BTreeSet<(Key, FencingToken)>>,
    /// The reverse: the session each holder is under.
    under: BTreeMap<(Key, FencingToken), FencingToken>,
    /// In the entry being applied: the holders each session lost.
    freed: BTreeMap<FencingToken, Vec<(Key, FencingToken)>>,
    /// This turn's ended sessions, with the holders they had.
    ended: Vec<(FencingToken, Vec<(Key, FencingToken)>)>,
    /// A change of this turn touched a session: the table is compared.
    dirty: bool,
}

/// A client's session, as it was promised.
#[derive(Debug)]
struct Promise {
    client: usize,
    valid_until_ms: u64,
    /// When the request that made (or last extended) it was sent.
    since_ms: u64,
}

#[derive(Debug, Default)]
pub struct Check {
    drift_ppm_max: u64,
    nodes: Vec<NodeView>,
    jumps: Vec<(u64, u64)>,
    /// The sessions clients were told are alive and have not closed.
    promises: BTreeMap<FencingToken, Promise>,
    /// What clients were granted under a session and have not let go.
    held: BTreeMap<(Key, FencingToken), FencingToken>,
    /// Sessions some node ended, and holders some node removed, with the
    /// true time: only the first application of each is judged, and an
    /// answer that comes later is judged against it.
    seen_ended: BTreeMap<FencingToken, u64>,
    seen_removed: BTreeMap<(Key, FencingToken), u64>,
    judged_promises: u64,
    judged_changes: u64,
}

impl Check {
    pub fn new(nodes: usize, drift_ppm_max: u64) -> Check {
        Check { drift_ppm_max, nodes: vec![NodeView::default(); nodes], ..Check::default() }
    }

    /// How long a TTL of `ttl_ms` lasts in true time, at worst.
    fn lasts_ms(&self, ttl_ms: u64) -> u64 {
        ttl_ms * 1_000_000 / (1_000_000 + self.drift_ppm_max)
    }

    /// Node `node` (re)started, or installed a snapshot: its sessions are
    /// the table's.
    pub fn reset(&mut self, node: usize, table: &LockTable) {
        let mut view = NodeView { dirty: true, ..NodeView::default() };
        for (session, _) in table.sessions() {
            view.members.insert(session, BTreeSet::new());
        }
        for (key, token, session, _) in holders(table) {
            if let Some(session) = session {
                view.members.entry(session).or_default().insert((key.clone(), token));
                view.under.insert((key, token), session);
            }
        }
        self.nodes[node] = view;
    }

    /// One change node `node` applied.
    pub fn applied(&mut self, applied: &Applied<'_>) -> Result<(), String> {
        let node = applied.node + 1;
        let view = &mut self.nodes[applied.node];
        view.dirty |= matches!(
            applied.event,
            AppliedEvent::SessionOpened { .. }
                | AppliedEvent::SessionEnded { .. }
                | AppliedEvent::Granted { session: Some(_), .. }
        );
        match applied.event {
            AppliedEvent::SessionOpened { session, .. } => {
                if view.members.insert(*session, BTreeSet::new()).is_some() {
                    return Err(format!("node {node} opened session {session} twice"));
                }
            }
            AppliedEvent::Granted { key, token, session: Some(session), .. } => {
                let Some(members) = view.members.get_mut(session) else {
                    return Err(format!(
                        "node {node} granted {key} ({token}) under session {session}, not open"
                    ));
                };
                members.insert((key.clone(), *token));
                if let Some(other) = view.under.insert((key.clone(), *token), *session) {
                    if other != *session {
                        return Err(format!(
                            "node {node} granted {key} ({token}) under session {session}, held under {other}"
                        ));
                    }
                }
            }
            AppliedEvent::Released { key, token }
            | AppliedEvent::Expired { key, token, .. }
            | AppliedEvent::Delayed { key, token, .. } => {
                if let Some(session) = view.under.remove(&(key.clone(), *token)) {
                    view.dirty = true;
                    if let Some(members) = view.members.get_mut(&session) {
                        members.remove(&(key.clone(), *token));
                    }
                    view.freed.entry(session).or_default().push((key.clone(), *token));
                }
            }
            AppliedEvent::SessionEnded { session, .. } => {
                self.judged_changes += 1;
                let left = view.members.remove(session).unwrap_or_default();
                let freed = view.freed.remove(session).unwrap_or_default();
                if let Some((key, token)) = left.first() {
                    return Err(format!(
                        "node {node} ended session {session} (index {}), but its holder {key} ({token}) was not \
                         reported released, expired or held back before",
                        applied.index
                    ));
                }
                view.ended.push((*session, freed));
            }
            AppliedEvent::Granted { .. }
            | AppliedEvent::Renewed { .. }
            | AppliedEvent::DelayLifted { .. }
            | AppliedEvent::Proclaimed { .. }
            | AppliedEvent::SessionRenewed { .. }
            | AppliedEvent::Restored => {}
        }
        Ok(())
    }

    /// After a turn of node `node` that applied changes, against the table
    /// it ends with (only when one of them touched a session: a change
    /// that does not leaves the sessions as they were).
    pub fn compare(&mut self, node: usize, table: &LockTable) -> Result<(), String> {
        let view = &mut self.nodes[node];
        if !std::mem::take(&mut view.dirty) {
            return Ok(());
        }
        view.freed.clear();
        let ended = std::mem::take(&mut view.ended);
        let name = node + 1;
        for (session, freed) in &ended {
            if table.session(*session).is_some() {
                return Err(format!("node {name} ended session {session}, and it is still open"));
            }
            for (key, token) in freed {
                if let Some((_, _, _, false)) = holders(table).find(|(k, t, _, _)| k == key && t == token) {
                    return Err(format!(
                        "node {name} ended session {session}, and {key} is still held under its token {token}"
                    ));
                }
            }
        }
        let mut named: BTreeMap<FencingToken, BTreeSet<(Key, FencingToken)>> = BTreeMap::new();
        for (key, token, session, delayed) in holders(table) {
            let Some(session) = session else { continue };
            let owner = owner_of(table, &key, token);
            match table.session(session) {
                None => {
                    return Err(format!(
                        "node {name}: {key} ({token}) is held under session {session}, which is not open"
                    ))
                }
                Some(open) if Some(&open.owner) != owner.as_ref() => {
                    return Err(format!(
                        "node {name}: {key} ({token}) of {owner:?} is held under session {session} of {:?}",
                        open.owner
                    ))
                }
                Some(_) if delayed => {
                    return Err(format!(
                        "node {name}: {key} ({token}) is held back, and under session {session}"
                    ))
                }
                Some(_) => {}
            }
            named.entry(session).or_default().insert((key, token));
        }
        let open: BTreeSet<FencingToken> = table.sessions().map(|(session, _)| session).collect();
        let known: BTreeSet<FencingToken> = view.members.keys().copied().collect();
        if open != known {
            return Err(format!(
                "node {name}'s open sessions are {open:?}, its applied changes opened and did not end {known:?}"
            ));
        }
        let empty = BTreeSet::new();
        for (session, open) in table.sessions() {
            let holds: BTreeSet<(Key, FencingToken)> = open.holds.iter().cloned().collect();
            let naming = named.get(&session).unwrap_or(&empty);
            let members = view.members.get(&session).unwrap_or(&empty);
            if holds != *naming || holds != *members {
                return Err(format!(
                    "node {name}: session {session} holds {holds:?} by its index, the holders naming it are \
                     {naming:?}, its applied changes put {members:?} under it"
                ));
            }
        }
        Ok(())
    }

    /// A node's clock jumped forward by `jump_ms` at true time `now_ms`.
    pub fn clock_jumped(&mut self, now_ms: u64, jump_ms: u64) {
        self.jumps.push((now_ms, jump_ms));
    }

    fn allowance(&self, since_ms: u64) -> u64 {
        self.jumps.iter().filter(|(at, _)| *at >= since_ms).map(|(_, jump)| jump).sum()
    }

    /// `client` was told it opened `session` with `ttl_ms`, for a request
    /// sent at `sent_ms`.
    pub fn opened(&mut self, client: usize, session: FencingToken, sent_ms: u64, ttl_ms: u64) {
        let valid_until_ms = sent_ms + self.lasts_ms(ttl_ms);
        self.promises.insert(session, Promise { client, valid_until_ms, since_ms: sent_ms });
    }

    /// `client` was told `session` is alive, for a request sent at
    /// `sent_ms`: if some node ended it already (the answer came after),
    /// that was before the promise ran out.
    pub fn kept_alive(
        &mut self,
        client: usize,
        session: FencingToken,
        sent_ms: u64,
        ttl_ms: u64,
    ) -> Result<(), String> {
        let until_ms = sent_ms + self.lasts_ms(ttl_ms);
        if let Some(ended_ms) = self.seen_ended.get(&session).copied() {
            self.judged_promises += 1;
            if ended_ms + self.allowance(sent_ms) < until_ms {
                return Err(format!(
                    "client {} was told session {session} is alive until {until_ms} ms, but it ended at {ended_ms} ms",
                    client + 1
                ));
            }
        }
        if let Some(promise) = self.promises.get_mut(&session) {
            if until_ms > promise.valid_until_ms {
                promise.valid_until_ms = until_ms;
                promise.since_ms = sent_ms;
            }
        }
        Ok(())
    }

    /// `client` was granted `key` under `token` in `session`: if some node
    /// removed it already (the answer came after), that was after the
    /// session's promise ran out.
    pub fn granted_in(
        &mut self,
        client: usize,
        session: FencingToken,
        key: &Key,
        token: FencingToken,
    ) -> Result<(), String> {
        let held = (key.clone(), token);
        if let (Some(removed_ms), Some(promise)) = (self.seen_removed.get(&held), self.promises.get(&session))
        {
            self.judged_promises += 1;
            if removed_ms + self.allowance(promise.since_ms) < promise.valid_until_ms {
                return Err(format!(
                    "client {} was granted {key} ({token}) under session {session}, promised until {} ms, but it was \
                     removed at {removed_ms} ms",
                    client + 1,
                    promise.valid_until_ms
                ));
            }
            return Ok(());
        }
        self.held.insert(held, session);
        Ok(())
    }

    /// A client lets go of `key` under `token` (it is releasing it, or was
    /// told it is gone).
    pub fn released(&mut self, key: &Key, token: FencingToken) {
        self.held.remove(&(key.clone(), token));
    }

    /// A client is closing `session`: nothing under it is promised.
    pub fn closing(&mut self, session: FencingToken) {
        self.promises.remove(&session);
        self.held.retain(|_, of| *of != session);
    }

    /// `client` was answered NoSession for `session` at `now_ms`.
    pub fn refused(&mut self, client: usize, session: FencingToken, now_ms: u64) -> Result<(), String> {
        if let Some(promise) = self.promises.remove(&session) {
            self.judged_promises += 1;
            if now_ms + self.allowance(promise.since_ms) < promise.valid_until_ms {
                return Err(format!(
                    "client {} was promised session {session} until {} ms, and was told at {now_ms} ms it is not open",
                    client + 1,
                    promise.valid_until_ms
                ));
            }
        }
        self.held.retain(|_, of| *of != session);
        Ok(())
    }

    /// Some node applied `event` at true time `now_ms`.
    pub fn first_applied(&mut self, event: &AppliedEvent, now_ms: u64) -> Result<(), String> {
        match event {
            AppliedEvent::SessionEnded { session, expired, .. } => {
                if self.seen_ended.contains_key(session) {
                    return Ok(());
                }
                self.seen_ended.insert(*session, now_ms);
                if let Some(promise) = self.promises.remove(session) {
                    self.judged_promises += 1;
                    if now_ms + self.allowance(promise.since_ms) < promise.valid_until_ms {
                        let how = if *expired { "expired" } else { "closed" };
                        return Err(format!(
                            "client {} was promised session {session} until {} ms, but it was {how} at {now_ms} ms",
                            promise.client + 1,
                            promise.valid_until_ms
                        ));
                    }
                }
                self.held.retain(|_, of| of != session);
            }
            AppliedEvent::Released { key, token }
            | AppliedEvent::Expired { key, token, .. }
            | AppliedEvent::Delayed { key, token, .. } => {
                let held = (key.clone(), *token);
                if self.seen_removed.contains_key(&held) {
                    return Ok(());
                }
                self.seen_removed.insert(held.clone(), now_ms);
                let Some(session) = self.held.remove(&held) else { return Ok(()) };
                if let Some(promise) = self.promises.get(&session) {
                    self.judged_promises += 1;
                    if now_ms + self.allowance(promise.since_ms) < promise.valid_until_ms {
                        return Err(format!(
                            "client {} was promised session {session}, and {key} ({token}) under it, until {} ms, \
                             but the lock was removed at {now_ms} ms",
                            promise.client + 1,
                            promise.valid_until_ms
                        ));
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// How often each side judged something, for the sweep's report.
    pub fn judged(&self) -> Vec<(&'static str, u64)> {
        vec![("session promises", self.judged_promises), ("session ends", self.judged_changes)]
    }
}

/// Every holder of `table`: plain locks and shared keys' holders, with the
/// session each is under and whether it is held back.
fn holders(table: &LockTable) -> impl Iterator<Item = (Key, FencingToken, Option<FencingToken>, bool)> + '_ {
    let locks =
        table.list(b"", usize::MAX).map(|(key, lock)| (key.clone(), lock.token, lock.session, lock.delayed));
    let shared = table.list_shared(b"", usize::MAX).flat_map(|(key, shared)| {
        shared
            .holders
            .iter()
            .map(move |(token, holder)| (key.clone(), *token, holder.session, holder.delayed))
    });
    locks.chain(shared)
}

fn owner_of(table: &LockTable, key: &Key, token: FencingToken) -> Option<Owner> {
    match table.holder(key.as_bytes()) {
        Some(lock) if lock.token == token => Some(lock.owner.clone()),
        _ => table.shared(key.as_bytes())?.holders.get(&token).map(|holder| holder.owner.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::*;
    use super::*;
    use fencelock_types::LeaseMs;

    fn on<'a>(event: &'a AppliedEvent) -> Applied<'a> {
        Applied { node: 0, local_ms: 0, is_leader: true, index: 1, replaying: false, event }
    }

    fn opened(n: u64) -> AppliedEvent {
        AppliedEvent::SessionOpened { session: token(n), ttl_ms: LeaseMs::new(1_000).unwrap() }
    }

    fn under(n: u64, session: u64) -> AppliedEvent {
        AppliedEvent::Granted {
            key: key(),
            token: token(n),
            lease_ms: LeaseMs::new(1_000).unwrap(),
            existing: false,
            session: Some(token(session)),
        }
    }

    fn ended(n: u64) -> AppliedEvent {
        AppliedEvent::SessionEnded { session: token(n), expired: true, proposer: None }
    }

    #[test]
    fn a_session_that_ends_without_freeing_its_holder_first_is_caught() {
        let mut check = Check::new(1, 0);
        check.applied(&on(&opened(1))).unwrap();
        check.applied(&on(&under(2, 1))).unwrap();
        let err = check.applied(&on(&ended(1))).unwrap_err();
        assert!(err.contains("its holder k (2) was not reported"), "{err}");
        // Freed first: passes; a grant under it afterwards does not.
        let mut check = Check::new(1, 0);
        check.applied(&on(&opened(1))).unwrap();
        check.applied(&on(&under(2, 1))).unwrap();
        check.applied(&on(&expired(2))).unwrap();
        check.applied(&on(&ended(1))).unwrap();
        assert!(check.applied(&on(&under(3, 1))).unwrap_err().contains("not open"));
    }

    #[test]
    fn a_session_ended_before_its_promise_ran_out_is_caught_whichever_comes_first() {
        // The end applied, then the keep-alive's answer (sent at 1 s).
        let mut check = Check::new(1, 0);
        check.opened(0, token(1), 0, 1_000);
        check.first_applied(&ended(1), 1_500).unwrap();
        let err = check.kept_alive(0, token(1), 1_000, 1_000).unwrap_err();
        assert!(err.contains("alive until 2000 ms, but it ended at 1500 ms"), "{err}");
        // The keep-alive's answer, then the end.
        let mut check = Check::new(1, 0);
        check.opened(0, token(1), 0, 1_000);
        check.kept_alive(0, token(1), 800, 1_000).unwrap();
        check.granted_in(0, token(1), &key(), token(2)).unwrap();
        let err = check.first_applied(&expired(2), 1_700).unwrap_err();
        assert!(err.contains("under it, until 1800 ms"), "{err}");
        assert!(check.first_applied(&ended(1), 1_700).is_err());
        // After the promise: fine; a NoSession then too.
        let mut check = Check::new(1, 0);
        check.opened(0, token(1), 0, 1_000);
        check.first_applied(&ended(1), 1_000).unwrap();
        check.refused(0, token(1), 1_100).unwrap();
    }
}
