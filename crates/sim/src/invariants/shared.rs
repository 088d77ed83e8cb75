//! Read-write locks and semaphores. The simulation's clients take them on
//! the keys under [`PREFIX`] only, and plain locks elsewhere, so the checks
//! tell the two apart by key: [`super::mutual_exclusion`] judges plain
//! locks, this module shared ones. (An applied change does not say its
//! key's kind, nor its holder's share: shares are learned from the tables,
//! where each holder shows its own, and from what clients are told.)
//!
//! On every node, each shared key's holders, rebuilt from the changes it
//! applied, keep the rules after every change: readers only beside readers,
//! a writer alone, a semaphore's holders all permits of one N and at most N
//! of them; a holder held back by lock-delay holds nothing, but keeps its
//! place in these counts until the delay is lifted. A new grant's token
//! does not hold the key yet; a re-grant, renewal, release, expiry or delay
//! names a live holder, and a lifted delay a held-back one; values never
//! touch a shared key. At the end of each turn the node's table holds
//! exactly those holders, in those shares, held back or not, with its
//! `permits` right.
//!
//! What clients were promised, as [`super::holders`] judges it for plain
//! locks: a client told Granted (or Renewed) in a share, for a request sent
//! at true time s with lease L, holds the key from the moment some node
//! first applied its grant until s + L/(1+ρ), ρ the drift bound, less the
//! forward clock jumps since, unless it let go first (sent a release, or was
//! told the lock is gone; held back by lock-delay, it holds nothing). At
//! no instant do the promises of a key, with a
//! grant applied at that instant, hold a writer beside anyone, a reader
//! beside a permit, or more than N permits of a semaphore of N; and no
//! promised token is released or expired before its promise ends. A holder
//! that asks for its key in another kind while its promise lasts is
//! answered Mismatch with its own kind, and no Mismatch names the asked
//! kind. A linearizable read of a shared key names, holder by holder, the
//! holders it had while the read was in flight, in their shares.
//!
//! Elsewhere, shared holders are judged with plain locks: their tokens by
//! [`super::tokens`] (a shared grant is a `Granted` change like any), their
//! leases by [`super::renewal`] and [`super::expiry`], acknowledgements by
//! [`super::durability`], and watches of the keys by [`super::watches`].

use std::collections::{BTreeMap, BTreeSet};

use fencelock_fsm::LockTable;
use fencelock_raft::AppliedEvent;
use fencelock_types::{FencingToken, Key, Share};

use super::Applied;

/// The keys the clients take as read-write locks and semaphores, and no
/// plain lock: inside the prefix the clients watch and list.
pub const PREFIX: &[u8] = b"k-";

/// Whether `key` is one the clients take shared.
pub fn is_shared(key: &[u8]) -> bool {
    key.starts_with(PREFIX)
}

/// Whether `event` changed a key the clients take shared.
pub fn of_shared_key(event: &AppliedEvent) -> bool {
    key_and_token(event).is_some_and(|(key, _)| is_shared(key.as_bytes()))
}

/// The key and token a change is about (none for a snapshot install).
fn key_and_token(event: &AppliedEvent) -> Option<(&Key, FencingToken)> {
    match event {
        AppliedEvent::Granted { key, token, .. }
        | AppliedEvent::Renewed { key, token, .. }
        | AppliedEvent::Released { key, token }
        | AppliedEvent::Expired { key, token, .. }
        | AppliedEvent::Delayed { key, token, .. }
        | AppliedEvent::DelayLifted { key, token, .. }
        | AppliedEvent::Proclaimed { key, token } => Some((key, *token)),
        AppliedEvent::Restored
        | AppliedEvent::SessionOpened { .. }
        | AppliedEvent::SessionRenewed { .. }
        | AppliedEvent::SessionEnded { .. } => None,
    }
}

#[derive(Debug, Default)]
pub struct Check {
    drift_ppm_max: u64,
    /// Per node: each shared key's holders, from its applied changes, and
    /// whether each is held back by lock-delay.
    holders: Vec<BTreeMap<Key, BTreeMap<FencingToken, bool>>>,
    /// Each shared holder's share, by its token (issued once, for one key).
    shares: BTreeMap<FencingToken, Share>,
    /// Every forward clock jump so far: (true time, length).
    jumps: Vec<(u64, u64)>,
    /// Every promise made, in order; each client's latest may be open.
    promises: Vec<Promise>,
    /// Per client, its open promise: an index into `promises`.
    open: BTreeMap<usize, usize>,
    /// Per key, the true time some node first applied each new grant.
    granted_at: BTreeMap<Key, BTreeMap<FencingToken, u64>>,
    /// When some node first applied each release, expiry or delay: the
    /// end of a holder's hold.
    removed_at: BTreeMap<(Key, FencingToken), u64>,
    /// Promises judged against a change of their key.
    judged: u64,
    /// Applied changes of shared keys judged on a node.
    judged_changes: u64,
    /// Mismatch answers judged.
    mismatches: u64,
    /// Reads of shared keys judged.
    reads: u64,
}

#[derive(Debug)]
struct Promise {
    client: usize,
    key: Key,
    token: FencingToken,
    share: Share,
    /// When some node first applied the grant.
    start_ms: u64,
    until_ms: u64,
    /// When the request that made (or last renewed) the promise was sent:
    /// clock jumps since count against it.
    since_ms: u64,
    /// When the client let go, if it did.
    ended_ms: Option<u64>,
}

impl Check {
    pub fn new(nodes: usize, drift_ppm_max: u64) -> Check {
        Check { drift_ppm_max, holders: vec![BTreeMap::new(); nodes], ..Check::default() }
    }

    /// Node `node`'s table was replaced (opened on its disk, a snapshot).
    pub fn reset(&mut self, node: usize, table: &LockTable) {
        self.holders[node] = table
            .list_shared(b"", usize::MAX)
            .map(|(key, shared)| {
                let holders = shared.holders.iter().map(|(token, holder)| (*token, holder.delayed));
                (key.clone(), holders.collect())
            })
            .collect();
    }

    /// Learns the share of every holder in `table`: a token keeps one.
    pub fn learn(&mut self, node: usize, table: &LockTable) -> Result<(), String> {
        for (key, shared) in table.list_shared(b"", usize::MAX) {
            for (token, holder) in shared.holders.iter() {
                match self.shares.get(token) {
                    Some(share) if *share != holder.share => {
                        return Err(format!(
                            "node {}: {key} is held under {token} as {:?}, which held it as {share:?} before",
                            node + 1,
                            holder.share
                        ))
                    }
                    Some(_) => {}
                    None => {
                        self.shares.insert(*token, holder.share);
                    }
                }
            }
        }
        Ok(())
    }

    /// Node `node` applied a change: judged on its own holders.
    pub fn applied(&mut self, applied: &Applied<'_>) -> Result<(), String> {
        let node = applied.node;
        let Some((key, token)) = key_and_token(applied.event).filter(|(key, _)| is_shared(key.as_bytes()))
        else {
            return Ok(());
        };
        self.judged_changes += 1;
        let tokens = self.holders[node].entry(key.clone()).or_default();
        match (applied.event, tokens.get(&token).copied()) {
            (AppliedEvent::Granted { existing: false, .. }, None) => {
                tokens.insert(token, false);
            }
            (AppliedEvent::Granted { existing: true, .. } | AppliedEvent::Renewed { .. }, Some(false)) => {}
            (AppliedEvent::Released { .. } | AppliedEvent::Expired { .. }, Some(false))
            | (AppliedEvent::DelayLifted { .. }, Some(true)) => {
                tokens.remove(&token);
            }
            (AppliedEvent::Delayed { .. }, Some(false)) => {
                tokens.insert(token, true);
            }
            (event, _) => {
                return Err(format!(
                    "node {}: {event:?}, but {key}'s holders (held back or not) were {tokens:?}",
                    node + 1,
                    tokens =
                        tokens.iter().map(|(token, delayed)| (token.get(), *delayed)).collect::<Vec<_>>()
                ))
            }
        }
        if tokens.is_empty() {
            self.holders[node].remove(key);
            return Ok(());
        }
        let shares: Vec<Share> = tokens.keys().filter_map(|token| self.shares.get(token).copied()).collect();
        rules(&shares)
            .map_err(|broken| format!("node {}: after {:?}, {key} is held {broken}", node + 1, applied.event))
    }

    /// At the end of a turn, node `node`'s table holds what its changes
    /// made, and keeps the rules.
    pub fn compare(&self, node: usize, table: &LockTable) -> Result<(), String> {
        let err = |message: String| Err(format!("node {}: {message}", node + 1));
        if let Some((key, _)) = table.list(PREFIX, 1).next() {
            return err(format!("{key} is a plain lock"));
        }
        let mut model = self.holders[node].iter();
        for (key, shared) in table.list_shared(b"", usize::MAX) {
            if !is_shared(key.as_bytes()) {
                return err(format!("{key} is held shared"));
            }
            let tokens: Vec<(FencingToken, bool)> =
                shared.holders.iter().map(|(token, holder)| (*token, holder.delayed)).collect();
            match model.next() {
                Some((modelled, held))
                    if modelled == key && held.iter().map(|(t, d)| (*t, *d)).eq(tokens.clone()) => {}
                other => {
                    return err(format!(
                        "{key} is held by {tokens:?} (held back or not), but its changes made {other:?}"
                    ))
                }
            }
            let shares: Vec<Share> = shared.holders.values().map(|holder| holder.share).collect();
            if let Err(broken) = rules(&shares) {
                return err(format!("{key} is held {broken}"));
            }
            if shares.iter().any(|share| share.permits() != shared.permits) {
                return err(format!("{key} has {} permits, but is held {shares:?}", shared.permits));
            }
        }
        if let Some((key, held)) = model.next() {
            return err(format!("{key} is held by no one, but its changes made {held:?}"));
        }
        Ok(())
    }

    /// A node's clock jumped forward by `jump_ms` at true time `now_ms`.
    pub fn clock_jumped(&mut self, now_ms: u64, jump_ms: u64) {
        self.jumps.push((now_ms, jump_ms));
    }

    /// Some node applied `event` at true time `now_ms`: its first
    /// application is judged against the promises.
    pub fn first_applied(&mut self, event: &AppliedEvent, now_ms: u64) -> Result<(), String> {
        match event {
            AppliedEvent::Granted { key, token, existing: false, .. } if is_shared(key.as_bytes()) => {
                let grants = self.granted_at.entry(key.clone()).or_default();
                if grants.contains_key(token) {
                    return Ok(());
                }
                grants.insert(*token, now_ms);
                self.judge_instant(key, now_ms, *token)
            }
            AppliedEvent::Released { key, token }
            | AppliedEvent::Expired { key, token, .. }
            | AppliedEvent::Delayed { key, token, .. }
                if is_shared(key.as_bytes()) =>
            {
                if self.removed_at.contains_key(&(key.clone(), *token)) {
                    return Ok(());
                }
                self.removed_at.insert((key.clone(), *token), now_ms);
                let promised: Vec<usize> = (0..self.promises.len())
                    .filter(|index| {
                        self.promises[*index].key == *key && self.promises[*index].token == *token
                    })
                    .collect();
                for index in promised {
                    self.judged += 1;
                    self.judge_removal(index, now_ms)?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// `client` was told it holds `key` under `token` as `share`, for a
    /// request sent at true time `sent_ms`.
    pub fn granted(
        &mut self,
        client: usize,
        key: &Key,
        token: FencingToken,
        share: Share,
        sent_ms: u64,
        lease_ms: u64,
    ) -> Result<(), String> {
        match self.shares.insert(token, share) {
            Some(known) if known != share => {
                return Err(format!(
                "client {} was granted {key} under {token} as {share:?}, which a table holds as {known:?}",
                client + 1
            ))
            }
            _ => {}
        }
        let Some(start_ms) = self.start_of(key, token) else {
            return Err(format!(
                "client {} was granted {key} under {token}, which no node applied",
                client + 1
            ));
        };
        if let Some(other) = self
            .open
            .values()
            .map(|index| &self.promises[*index])
            .find(|promise| promise.client != client && promise.key == *key && promise.token == token)
        {
            return Err(format!(
                "clients {} and {} were both granted {key} under {token}",
                other.client + 1,
                client + 1
            ));
        }
        let until_ms = sent_ms + self.lasts_ms(lease_ms);
        let promise = Promise {
            client,
            key: key.clone(),
            token,
            share,
            start_ms,
            until_ms,
            since_ms: sent_ms,
            ended_ms: None,
        };
        self.promises.push(promise);
        if let Some(earlier) = self.open.insert(client, self.promises.len() - 1) {
            // A client holds one lock at a time: it let go of the last.
            self.promises[earlier].ended_ms.get_or_insert(sent_ms);
        }
        self.judge_promise(self.promises.len() - 1)
    }

    /// `client` was told its lock was renewed, for a request sent at
    /// `sent_ms`.
    pub fn renewed(
        &mut self,
        client: usize,
        key: &Key,
        token: FencingToken,
        sent_ms: u64,
        lease_ms: u64,
    ) -> Result<(), String> {
        let until_ms = sent_ms + self.lasts_ms(lease_ms);
        let Some(&index) = self.open.get(&client) else { return Ok(()) };
        let promise = &mut self.promises[index];
        if promise.key != *key || promise.token != token || until_ms <= promise.until_ms {
            return Ok(());
        }
        promise.until_ms = until_ms;
        promise.since_ms = sent_ms;
        self.judge_promise(index)
    }

    /// `client` lets go of what it holds at true time `now_ms` (it is
    /// sending a release, or was told its lock is gone).
    pub fn released(&mut self, client: usize, now_ms: u64) {
        if let Some(index) = self.open.remove(&client) {
            self.promises[index].ended_ms = Some(now_ms);
        }
    }

    /// `client`, holding its key, asked for it as `asked` in a request sent
    /// at `sent_ms`, answered at `now_ms` Mismatch with `permits` (`None`:
    /// any other answer). While its promise lasts, its own holder keeps
    /// the key of its kind.
    pub fn probed(
        &mut self,
        client: usize,
        asked: Share,
        permits: Option<u32>,
        sent_ms: u64,
        now_ms: u64,
    ) -> Result<(), String> {
        self.mismatched(client, asked, permits)?;
        let Some(promise) = self.open.get(&client).map(|index| &self.promises[*index]) else { return Ok(()) };
        if promise.start_ms > sent_ms || now_ms >= self.end_ms(promise, now_ms) {
            return Ok(());
        }
        self.judged += 1;
        let own = promise.share.permits();
        if permits != Some(own) {
            return Err(format!(
                "client {}, promised {} under {} as {:?} until {} ms, asked for it as {asked:?} at {sent_ms} ms and was \
                 answered {} at {now_ms} ms, not Mismatch {{ permits: {own} }}",
                client + 1,
                promise.key,
                promise.token,
                promise.share,
                promise.until_ms,
                match permits {
                    Some(permits) => format!("Mismatch {{ permits: {permits} }}"),
                    None => "other than a Mismatch".to_owned(),
                }
            ));
        }
        Ok(())
    }

    /// An acquire as `asked` was answered Mismatch with `permits` (`None`:
    /// not a Mismatch): the key is of another kind.
    pub fn mismatched(&mut self, client: usize, asked: Share, permits: Option<u32>) -> Result<(), String> {
        let Some(permits) = permits else { return Ok(()) };
        self.mismatches += 1;
        let same_kind = match asked {
            Share::Permit(asked) => permits == asked,
            Share::Read | Share::Write => permits == 0,
        };
        if same_kind {
            return Err(format!(
                "client {} asked as {asked:?} and was answered Mismatch {{ permits: {permits} }}, its own kind",
                client + 1
            ));
        }
        Ok(())
    }

    /// A linearizable read of `key` sent at `sent_ms` named `holders` at
    /// `answered_ms`. Judged holder by holder, as some node first applied
    /// each change: each held the key at some moment while the read was
    /// in flight, in its own share, none that held it all along is
    /// missing, and together they keep the rules.
    pub fn read(
        &mut self,
        key: &Key,
        holders: &[(FencingToken, Share)],
        sent_ms: u64,
        answered_ms: u64,
    ) -> Result<(), String> {
        self.reads += 1;
        let err = |what: String| {
            Err(format!(
                "a read of {key} sent at {sent_ms} ms answered {holders:?} at {answered_ms} ms, but {what}"
            ))
        };
        let shares: Vec<Share> = holders.iter().map(|(_, share)| *share).collect();
        if let Err(broken) = rules(&shares) {
            return err(format!("they cannot hold it {broken}"));
        }
        let grants = self.granted_at.get(key);
        for (token, share) in holders {
            let Some(granted_ms) = grants.and_then(|grants| grants.get(token)) else {
                return err(format!("no node applied a grant of {token}"));
            };
            let removed_ms = self.removed_at.get(&(key.clone(), *token));
            if *granted_ms > answered_ms || removed_ms.is_some_and(|removed_ms| *removed_ms < sent_ms) {
                return err(format!("{token} held it from {granted_ms} ms to {removed_ms:?} ms"));
            }
            if self.shares.get(token).is_some_and(|known| known != share) {
                return err(format!("{token} holds it as {:?}", self.shares[token]));
            }
        }
        for (token, granted_ms) in grants.into_iter().flatten() {
            let removed_ms = self.removed_at.get(&(key.clone(), *token));
            let all_along =
                *granted_ms < sent_ms && removed_ms.is_none_or(|removed_ms| *removed_ms > answered_ms);
            if all_along && holders.iter().all(|(held, _)| held != token) {
                return err(format!("{token} held it from {granted_ms} ms to {removed_ms:?} ms"));
            }
        }
        Ok(())
    }

    /// How often each part judged something, for the sweep's report.
    pub fn judged(&self) -> [(&'static str, u64); 4] {
        [
            ("shared promises", self.judged),
            ("shared changes", self.judged_changes),
            ("shared reads", self.reads),
            ("mismatches", self.mismatches),
        ]
    }

    /// How long a lease of `lease_ms` lasts in true time, at worst.
    fn lasts_ms(&self, lease_ms: u64) -> u64 {
        lease_ms * 1_000_000 / (1_000_000 + self.drift_ppm_max)
    }

    /// When some node first applied the grant of `token`.
    fn start_of(&self, key: &Key, token: FencingToken) -> Option<u64> {
        self.granted_at.get(key)?.get(&token).copied()
    }

    /// When `promise` ends, as far as instant `at_ms` is concerned: the
    /// forward clock jumps from when it was made up to then shorten it.
    fn end_ms(&self, promise: &Promise, at_ms: u64) -> u64 {
        let allowance: u64 = self
            .jumps
            .iter()
            .filter(|(jumped_ms, _)| *jumped_ms >= promise.since_ms && *jumped_ms <= at_ms)
            .map(|(_, jump_ms)| jump_ms)
            .sum();
        let lapses_ms = promise.until_ms.saturating_sub(allowance);
        promise.ended_ms.map_or(lapses_ms, |ended_ms| ended_ms.min(lapses_ms))
    }

    fn covers(&self, promise: &Promise, at_ms: u64) -> bool {
        promise.start_ms <= at_ms && at_ms < self.end_ms(promise, at_ms)
    }

    /// Judges a new or extended promise: against the removal of its token,
    /// and at every grant of its key applied while it lasts (its own
    /// included), the promises and the grant together.
    fn judge_promise(&mut self, index: usize) -> Result<(), String> {
        let key = self.promises[index].key.clone();
        if let Some(&removed_ms) = self.removed_at.get(&(key.clone(), self.promises[index].token)) {
            self.judged += 1;
            self.judge_removal(index, removed_ms)?;
        }
        let promise = &self.promises[index];
        let instants: Vec<(FencingToken, u64)> = self
            .granted_at
            .get(&key)
            .map(|grants| {
                grants
                    .iter()
                    .filter(|(_, at_ms)| self.covers(promise, **at_ms))
                    .map(|(t, at)| (*t, *at))
                    .collect()
            })
            .unwrap_or_default();
        for (token, at_ms) in instants {
            self.judge_instant(&key, at_ms, token)?;
        }
        Ok(())
    }

    /// A promised token was removed at `removed_ms`: not before its promise
    /// ended.
    fn judge_removal(&self, index: usize, removed_ms: u64) -> Result<(), String> {
        let promise = &self.promises[index];
        if self.covers(promise, removed_ms) {
            return Err(format!(
                "client {} was promised {} under {} as {:?} until {} ms, but it was removed at {removed_ms} ms",
                promise.client + 1,
                promise.key,
                promise.token,
                promise.share,
                promise.until_ms
            ));
        }
        Ok(())
    }

    /// At `at_ms`, when some node first applied the grant of `granted`, the
    /// promises of `key` and that grant keep the rules.
    fn judge_instant(&mut self, key: &Key, at_ms: u64, granted: FencingToken) -> Result<(), String> {
        let (judged, verdict) = self.verdict(key, at_ms, granted);
        self.judged += judged;
        verdict
    }

    /// How many promises [`Check::judge_instant`] judges, and its verdict.
    fn verdict(&self, key: &Key, at_ms: u64, granted: FencingToken) -> (u64, Result<(), String>) {
        // A promise of a later token (granted after `granted` in log order)
        // cannot have held at `granted`'s grant, even in the same
        // millisecond: one entry may free `granted` (its ghost release, say)
        // and the next grant a later token its place (seed 2378198938).
        let covering: Vec<&Promise> = self
            .promises
            .iter()
            .filter(|promise| promise.key == *key && promise.token <= granted && self.covers(promise, at_ms))
            .collect();
        if covering.is_empty() {
            return (0, Ok(()));
        }
        let mut shares: Vec<Share> = covering.iter().map(|promise| promise.share).collect();
        let newcomer = covering.iter().all(|promise| promise.token != granted);
        let unknown = newcomer && !self.shares.contains_key(&granted);
        if let Some(share) = self.shares.get(&granted).filter(|_| newcomer) {
            shares.push(*share);
        }
        let mut broken = rules(&shares).err();
        // A grant whose share no table has shown yet still takes a place:
        // beside a writer, or in a semaphore's last permit, there is none.
        let full = shares.iter().any(|share| match share {
            Share::Write => true,
            Share::Permit(permits) => shares.len() >= *permits as usize,
            Share::Read => false,
        });
        if broken.is_none() && unknown && full {
            broken = Some(format!("as {shares:?} and one more at once"));
        }
        let judged = covering.len() as u64;
        let Some(broken) = broken else { return (judged, Ok(())) };
        let promised: Vec<String> = covering
            .iter()
            .map(|promise| {
                format!(
                    "client {} under {} as {:?} from {} ms until {} ms",
                    promise.client + 1,
                    promise.token,
                    promise.share,
                    promise.start_ms,
                    self.end_ms(promise, at_ms)
                )
            })
            .collect();
        let grant = if newcomer { format!(", when {granted} was granted") } else { String::new() };
        (
            judged,
            Err(format!(
                "at {at_ms} ms{grant}, {key} was held {broken}: promised to {}",
                promised.join(", ")
            )),
        )
    }
}

/// Whether holders in `shares` may hold one key together: readers only
/// beside readers, a writer alone, permits all of one semaphore and no more
/// than it has. Else what is wrong.
fn rules(shares: &[Share]) -> Result<(), String> {
    let writer = shares.contains(&Share::Write);
    let permits: BTreeSet<u32> = shares.iter().map(|share| share.permits()).collect();
    let too_many = match permits.first() {
        Some(&permits) if permits > 0 => shares.len() > permits as usize,
        _ => false,
    };
    if writer && shares.len() > 1 || permits.len() > 1 || too_many {
        Err(format!("as {shares:?} at once"))
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::token;
    use super::*;
    use fencelock_types::{Command, LeaseMs, Owner};

    fn rw() -> Key {
        Key::new(b"k-rw".to_vec()).unwrap()
    }

    fn sem() -> Key {
        Key::new(b"k-sem".to_vec()).unwrap()
    }

    fn granted(key: &Key, n: u64) -> AppliedEvent {
        AppliedEvent::Granted {
            key: key.clone(),
            token: token(n),
            lease_ms: LeaseMs::new(1_000).unwrap(),
            existing: false,
            session: None,
        }
    }

    fn released(key: &Key, n: u64) -> AppliedEvent {
        AppliedEvent::Released { key: key.clone(), token: token(n) }
    }

    fn on(node: usize, event: &AppliedEvent) -> Applied<'_> {
        Applied { node, local_ms: 0, is_leader: false, index: 1, replaying: false, event }
    }

    /// The table `shares` make on `key`, one owner each, in order.
    fn table(key: &Key, shares: &[Share]) -> LockTable {
        let mut table = LockTable::new();
        for (n, share) in shares.iter().enumerate() {
            table.apply(Command::GrantShared {
                session: None,
                key: key.clone(),
                lease_ms: LeaseMs::new(1_000).unwrap(),
                owner: Owner::new(format!("o{n}").into_bytes()).unwrap(),
                share: *share,
            });
        }
        table
    }

    #[test]
    fn a_writer_beside_a_reader_on_a_node_is_caught() {
        let mut check = Check::new(1, 0);
        check.learn(0, &table(&rw(), &[Share::Read, Share::Read])).unwrap();
        check.shares.insert(token(3), Share::Write);
        check.applied(&on(0, &granted(&rw(), 1))).unwrap();
        check.applied(&on(0, &granted(&rw(), 2))).unwrap();
        let err = check.applied(&on(0, &granted(&rw(), 3))).unwrap_err();
        assert!(err.contains("k-rw is held as [Read, Read, Write] at once"), "{err}");
        // Readers beside readers, and a writer once they are gone, pass.
        let mut check = Check::new(1, 0);
        check.learn(0, &table(&rw(), &[Share::Read, Share::Read])).unwrap();
        check.shares.insert(token(3), Share::Write);
        for event in
            [granted(&rw(), 1), granted(&rw(), 2), released(&rw(), 1), released(&rw(), 2), granted(&rw(), 3)]
        {
            check.applied(&on(0, &event)).unwrap();
        }
    }

    #[test]
    fn a_permit_too_many_or_of_another_semaphore_on_a_node_is_caught() {
        let mut check = Check::new(1, 0);
        check.learn(0, &table(&sem(), &[Share::Permit(2), Share::Permit(2)])).unwrap();
        check.shares.insert(token(3), Share::Permit(2));
        check.applied(&on(0, &granted(&sem(), 1))).unwrap();
        check.applied(&on(0, &granted(&sem(), 2))).unwrap();
        let err = check.applied(&on(0, &granted(&sem(), 3))).unwrap_err();
        assert!(err.contains("as [Permit(2), Permit(2), Permit(2)] at once"), "{err}");
        let mut check = Check::new(1, 0);
        check.shares.insert(token(1), Share::Permit(2));
        check.shares.insert(token(2), Share::Permit(3));
        check.applied(&on(0, &granted(&sem(), 1))).unwrap();
        assert!(check.applied(&on(0, &granted(&sem(), 2))).is_err());
    }

    #[test]
    fn changes_of_tokens_that_do_not_hold_the_key_are_caught() {
        let mut check = Check::new(1, 0);
        check.applied(&on(0, &granted(&rw(), 1))).unwrap();
        let err = check.applied(&on(0, &granted(&rw(), 1))).unwrap_err();
        assert!(err.contains("but k-rw's holders (held back or not) were [(1, false)]"), "{err}");
        let regrant = AppliedEvent::Granted {
            key: rw(),
            token: token(2),
            lease_ms: LeaseMs::new(1_000).unwrap(),
            existing: true,
            session: None,
        };
        assert!(check.applied(&on(0, &regrant)).is_err());
        assert!(check.applied(&on(0, &released(&rw(), 2))).is_err());
        let delayed = AppliedEvent::Proclaimed { key: rw(), token: token(1) };
        assert!(check.applied(&on(0, &delayed)).is_err(), "values are for plain locks");
        // Plain keys are not this check's.
        let plain = AppliedEvent::Released { key: super::super::fixtures::key(), token: token(9) };
        check.applied(&on(0, &plain)).unwrap();
    }

    #[test]
    fn a_holder_held_back_by_lock_delay_keeps_its_place_until_lifted() {
        let delayed = |n| AppliedEvent::Delayed {
            key: rw(),
            token: token(n),
            delay_ms: LeaseMs::new(400).unwrap(),
            proposer: None,
        };
        let lifted =
            |n| AppliedEvent::DelayLifted { key: rw(), token: token(n), proposer: None, forced: false };
        let mut check = Check::new(1, 0);
        check.shares.insert(token(1), Share::Write);
        check.shares.insert(token(2), Share::Read);
        check.applied(&on(0, &granted(&rw(), 1))).unwrap();
        check.applied(&on(0, &delayed(1))).unwrap();
        // Held back, it renews nothing and is lifted once.
        let renewed =
            AppliedEvent::Renewed { key: rw(), token: token(1), lease_ms: LeaseMs::new(1_000).unwrap() };
        assert!(check.applied(&on(0, &renewed)).is_err());
        let err = check.applied(&on(0, &granted(&rw(), 2))).unwrap_err();
        assert!(err.contains("k-rw is held as [Write, Read] at once"), "{err}");

        let mut check = Check::new(1, 0);
        check.shares.insert(token(1), Share::Write);
        check.shares.insert(token(2), Share::Read);
        assert!(check.applied(&on(0, &lifted(1))).is_err(), "lifted without a delay");
        check.applied(&on(0, &granted(&rw(), 1))).unwrap();
        assert!(check.applied(&on(0, &lifted(1))).is_err(), "lifted while live");
        check.applied(&on(0, &delayed(1))).unwrap();
        // The table shows it held back.
        let mut held = table(&rw(), &[Share::Write]);
        assert!(check.compare(0, &held).unwrap_err().contains("held back or not"));
        held.apply(Command::Expire { key: rw(), token: token(1), delay: Some(LeaseMs::new(400).unwrap()) });
        check.compare(0, &held).unwrap();
        check.applied(&on(0, &lifted(1))).unwrap();
        check.applied(&on(0, &granted(&rw(), 2))).unwrap();

        // Held back while promised: the promise was broken.
        let mut check = Check::new(1, 0);
        grant_at(&mut check, &rw(), 1, Share::Write, 10).unwrap();
        check.granted(0, &rw(), token(1), Share::Write, 5, 1_000).unwrap();
        let err = check.first_applied(&delayed(1), 600).unwrap_err();
        assert!(err.contains("but it was removed at 600 ms"), "{err}");
    }

    #[test]
    fn a_table_unlike_its_changes_is_caught() {
        let mut check = Check::new(1, 0);
        let held = table(&rw(), &[Share::Read, Share::Read]);
        check.applied(&on(0, &granted(&rw(), 1))).unwrap();
        let err = check.compare(0, &held).unwrap_err();
        assert!(
            err.contains("k-rw is held by [(FencingToken(1), false), (FencingToken(2), false)] (held back or not), but"),
            "{err}"
        );
        check.applied(&on(0, &granted(&rw(), 2))).unwrap();
        check.compare(0, &held).unwrap();
        let err = check.compare(0, &LockTable::new()).unwrap_err();
        assert!(err.contains("k-rw is held by no one"), "{err}");
        // A plain lock on a shared key, a shared lock on a plain one.
        let mut plain = LockTable::new();
        plain.apply(Command::Grant {
            session: None,
            key: rw(),
            lease_ms: LeaseMs::new(1_000).unwrap(),
            owner: Owner::new(b"o".to_vec()).unwrap(),
            value: fencelock_types::Value::none(),
        });
        assert!(Check::new(1, 0).compare(0, &plain).unwrap_err().contains("k-rw is a plain lock"));
        let other = table(&super::super::fixtures::key(), &[Share::Read]);
        assert!(Check::new(1, 0).compare(0, &other).unwrap_err().contains("k is held shared"));
    }

    #[test]
    fn a_token_seen_in_two_shares_is_caught() {
        let mut check = Check::new(2, 0);
        check.learn(0, &table(&rw(), &[Share::Read])).unwrap();
        let err = check.learn(1, &table(&rw(), &[Share::Write])).unwrap_err();
        assert!(err.contains("node 2: k-rw is held under 1 as Write, which held it as Read before"), "{err}");
        let err = check.granted(0, &rw(), token(1), Share::Write, 0, 1_000).unwrap_err();
        assert!(err.contains("as Write, which a table holds as Read"), "{err}");
    }

    /// A checker that saw `key` granted under token `n` as `share` at `at_ms`.
    fn grant_at(check: &mut Check, key: &Key, n: u64, share: Share, at_ms: u64) -> Result<(), String> {
        check.shares.insert(token(n), share);
        check.first_applied(&granted(key, n), at_ms)
    }

    #[test]
    fn a_grant_beside_a_promised_writer_is_caught_and_after_it_let_go_is_not() {
        let mut check = Check::new(1, 0);
        grant_at(&mut check, &rw(), 1, Share::Write, 10).unwrap();
        check.granted(0, &rw(), token(1), Share::Write, 5, 1_000).unwrap();
        let err = grant_at(&mut check, &rw(), 2, Share::Read, 500).unwrap_err();
        assert!(
            err.contains("at 500 ms, when 2 was granted, k-rw was held as [Write, Read] at once"),
            "{err}"
        );
        assert!(err.contains("client 1 under 1 as Write from 10 ms until 1005 ms"), "{err}");

        let mut check = Check::new(1, 0);
        grant_at(&mut check, &rw(), 1, Share::Write, 10).unwrap();
        check.granted(0, &rw(), token(1), Share::Write, 5, 1_000).unwrap();
        check.released(0, 400);
        check.first_applied(&released(&rw(), 1), 410).unwrap();
        grant_at(&mut check, &rw(), 2, Share::Read, 500).unwrap();
        // A grant whose share no table showed still takes a place.
        let mut check = Check::new(1, 0);
        grant_at(&mut check, &rw(), 1, Share::Write, 10).unwrap();
        check.granted(0, &rw(), token(1), Share::Write, 5, 1_000).unwrap();
        let err = check.first_applied(&granted(&rw(), 2), 500).unwrap_err();
        assert!(err.contains("as [Write] and one more at once"), "{err}");
    }

    #[test]
    fn readers_together_pass_and_a_third_permit_of_two_is_caught() {
        let mut check = Check::new(1, 0);
        grant_at(&mut check, &rw(), 1, Share::Read, 10).unwrap();
        grant_at(&mut check, &rw(), 2, Share::Read, 20).unwrap();
        check.granted(0, &rw(), token(1), Share::Read, 5, 1_000).unwrap();
        check.granted(1, &rw(), token(2), Share::Read, 15, 1_000).unwrap();
        grant_at(&mut check, &rw(), 3, Share::Read, 30).unwrap();

        let mut check = Check::new(1, 0);
        grant_at(&mut check, &sem(), 1, Share::Permit(2), 10).unwrap();
        grant_at(&mut check, &sem(), 2, Share::Permit(2), 20).unwrap();
        check.granted(0, &sem(), token(1), Share::Permit(2), 5, 1_000).unwrap();
        check.granted(1, &sem(), token(2), Share::Permit(2), 15, 1_000).unwrap();
        let err = grant_at(&mut check, &sem(), 3, Share::Permit(2), 30).unwrap_err();
        assert!(err.contains("as [Permit(2), Permit(2), Permit(2)] at once"), "{err}");
    }

    #[test]
    fn a_later_token_granted_in_the_same_millisecond_does_not_hold_at_an_earlier_grant() {
        // Seed 2378198938: permit 5 is promised; ghost 15 (its answer lost)
        // is granted, released by its ghost release and its place granted
        // to 16, all applied at 2,796 ms. 16's promise starts at 2,796 but
        // did not hold when 15 was granted.
        let mut check = Check::new(1, 0);
        grant_at(&mut check, &sem(), 5, Share::Permit(2), 360).unwrap();
        check.granted(0, &sem(), token(5), Share::Permit(2), 359, 4_000).unwrap();
        grant_at(&mut check, &sem(), 15, Share::Permit(2), 2_796).unwrap();
        check.first_applied(&released(&sem(), 15), 2_796).unwrap();
        grant_at(&mut check, &sem(), 16, Share::Permit(2), 2_796).unwrap();
        check.granted(1, &sem(), token(16), Share::Permit(2), 2_796, 4_000).unwrap();
        // A third permit after them all is still caught.
        let err = grant_at(&mut check, &sem(), 17, Share::Permit(2), 2_800).unwrap_err();
        assert!(err.contains("when 17 was granted"), "{err}");
    }

    #[test]
    fn a_promise_answered_after_a_conflicting_grant_is_caught_when_it_is_made() {
        // The reader's grant applied at 20, inside the writer's promise,
        // before the writer heard it was granted.
        let mut check = Check::new(1, 0);
        grant_at(&mut check, &rw(), 1, Share::Write, 10).unwrap();
        grant_at(&mut check, &rw(), 2, Share::Read, 20).unwrap();
        check.granted(1, &rw(), token(2), Share::Read, 15, 1_000).unwrap();
        let err = check.granted(0, &rw(), token(1), Share::Write, 5, 1_000).unwrap_err();
        assert!(err.contains("at 20 ms, k-rw was held as [Read, Write] at once"), "{err}");
        // And a renewal that stretches a promise over a later grant.
        let mut check = Check::new(1, 0);
        grant_at(&mut check, &rw(), 1, Share::Write, 10).unwrap();
        check.granted(0, &rw(), token(1), Share::Write, 5, 1_000).unwrap();
        grant_at(&mut check, &rw(), 2, Share::Read, 1_500).unwrap();
        let err = check.renewed(0, &rw(), token(1), 900, 1_000).unwrap_err();
        assert!(err.contains("at 1500 ms, when 2 was granted"), "{err}");
    }

    #[test]
    fn a_promised_token_removed_early_is_caught_and_clock_jumps_shorten_promises() {
        let mut check = Check::new(1, 0);
        grant_at(&mut check, &sem(), 1, Share::Permit(2), 10).unwrap();
        check.granted(0, &sem(), token(1), Share::Permit(2), 5, 1_000).unwrap();
        let expired = AppliedEvent::Expired { key: sem(), token: token(1), proposer: None };
        let err = check.first_applied(&expired, 900).unwrap_err();
        assert!(err.contains("client 1 was promised k-sem under 1 as Permit(2) until 1005 ms"), "{err}");
        // Removed before the answer came: caught when the promise is made.
        let mut check = Check::new(1, 0);
        grant_at(&mut check, &sem(), 1, Share::Permit(2), 10).unwrap();
        check.first_applied(&expired, 900).unwrap();
        assert!(check.granted(0, &sem(), token(1), Share::Permit(2), 5, 1_000).is_err());
        // A jump of 200 ms at 100 ms: the promise lasts until 805 ms.
        let mut check = Check::new(1, 0);
        grant_at(&mut check, &sem(), 1, Share::Permit(2), 10).unwrap();
        check.granted(0, &sem(), token(1), Share::Permit(2), 5, 1_000).unwrap();
        check.clock_jumped(100, 200);
        let judged = check.judged()[0].1;
        check.first_applied(&expired, 900).unwrap();
        assert_eq!(check.judged()[0].1, judged + 1);
    }

    #[test]
    fn a_holder_asking_in_another_kind_is_answered_mismatch_with_its_own() {
        let mut check = Check::new(1, 0);
        grant_at(&mut check, &sem(), 1, Share::Permit(2), 10).unwrap();
        check.granted(0, &sem(), token(1), Share::Permit(2), 5, 1_000).unwrap();
        check.probed(0, Share::Read, Some(2), 100, 110).unwrap();
        let err = check.probed(0, Share::Permit(3), Some(0), 100, 110).unwrap_err();
        assert!(
            err.contains("answered Mismatch { permits: 0 } at 110 ms, not Mismatch { permits: 2 }"),
            "{err}"
        );
        let err = check.probed(0, Share::Read, None, 100, 110).unwrap_err();
        assert!(err.contains("answered other than a Mismatch"), "{err}");
        // After its promise ran out, anything goes.
        check.probed(0, Share::Read, None, 1_100, 1_110).unwrap();
        // A Mismatch naming the asked kind is wrong for anyone.
        let err = check.mismatched(3, Share::Read, Some(0)).unwrap_err();
        assert!(err.contains("client 4 asked as Read and was answered Mismatch { permits: 0 }, its own kind"));
        assert!(check.mismatched(3, Share::Permit(2), Some(2)).is_err());
        check.mismatched(3, Share::Write, Some(2)).unwrap();
    }

    #[test]
    fn a_read_naming_a_gone_holder_or_missing_a_steady_one_is_caught() {
        let mut check = Check::new(1, 0);
        grant_at(&mut check, &rw(), 1, Share::Read, 10).unwrap();
        grant_at(&mut check, &rw(), 2, Share::Read, 20).unwrap();
        check.first_applied(&released(&rw(), 1), 30).unwrap();
        check.read(&rw(), &[(token(2), Share::Read)], 40, 50).unwrap();
        // Either way, for a read in flight while token 1 went.
        check.read(&rw(), &[(token(1), Share::Read), (token(2), Share::Read)], 25, 50).unwrap();
        check.read(&rw(), &[(token(2), Share::Read)], 25, 50).unwrap();
        let err = check.read(&rw(), &[(token(1), Share::Read), (token(2), Share::Read)], 40, 50).unwrap_err();
        assert!(err.contains("but 1 held it from 10 ms to Some(30) ms"), "{err}");
        let err = check.read(&rw(), &[], 40, 50).unwrap_err();
        assert!(err.contains("but 2 held it from 20 ms to None ms"), "{err}");
        assert!(check.read(&rw(), &[(token(2), Share::Write)], 40, 50).is_err(), "in another share");
        assert!(check.read(&rw(), &[(token(7), Share::Read)], 40, 50).is_err(), "never granted");
        assert_eq!(check.judged().map(|(_, n)| n)[2], 7);
    }
}
