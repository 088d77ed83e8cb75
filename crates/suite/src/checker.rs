//! The checker: reads a finished run (the history, the fenced store's log,
//! the final listing and what the healed cluster looked like) and reports
//! every violation of the properties fencelock promises.
//!
//! It is pure, so the unit tests feed it hand-made histories.
//!
//! Only answers that are linearizable count as evidence about who held a
//! lock when: a grant (committed through the log between its invoke and
//! complete), a release answered `released` (likewise), a `check` answered
//! `holds` (ReadIndex on the leader) and the final `list` (likewise). A
//! `Held` answer is not: the leader decides it from its applied table
//! without a round trip, so a deposed leader may still give it.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use crate::converge::{Convergence, Listing};
use crate::history::{Op, OpKind, Outcome, ShareKind};
use crate::store::StoreWrite;

/// The most violations each check lists (all are counted).
const LISTED_MAX: usize = 20;

/// The share of a lease the lease check allows for clock rates: leases.md
/// asks clients to keep a margin of 2–3 %.
const LEASE_MARGIN: f64 = 0.02;

/// What the checker reads.
#[derive(Clone, Copy, Debug)]
pub struct Input<'a> {
    pub ops: &'a [Op],
    pub store: &'a [StoreWrite],
    pub listing: Option<&'a Listing>,
    pub convergence: Option<&'a Convergence>,
    /// When nodes ran with skewed clocks on purpose (from the first skewed
    /// restart to the last restart back), in microseconds since the run
    /// started. A lease cut short around then is what the fault does, not
    /// a bug: it is reported apart and fails nothing.
    pub skew_windows: &'a [(u64, u64)],
}

/// The verdict of one check.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub about: &'static str,
    /// False when a violation counts against the run.
    pub enforced: bool,
    pub violations: usize,
    /// The first violations, described.
    pub examples: Vec<String>,
}

impl Check {
    fn new(name: &'static str, about: &'static str) -> Check {
        Check { name, about, enforced: true, violations: 0, examples: Vec::new() }
    }

    fn violation(&mut self, message: String) {
        self.violations += 1;
        if self.examples.len() < LISTED_MAX {
            self.examples.push(message);
        }
    }

    pub fn passed(&self) -> bool {
        self.violations == 0
    }

    /// True when this check fails the run.
    pub fn fails_run(&self) -> bool {
        self.enforced && !self.passed()
    }
}

/// Runs every check.
pub fn check(input: &Input<'_>) -> Vec<Check> {
    let (lease, skewed) = lease_expiry(input);
    let mut checks =
        vec![fenced_store(input), tokens(input), mutual_exclusion(input), shared_exclusion(input), lease];
    if !input.skew_windows.is_empty() {
        checks.push(skewed);
    }
    checks.push(convergence(input));
    checks.push(observers(input));
    checks
}

/// An election observer tells leaders in log order: for each observer and
/// key, the leaders' tokens and the log indexes it was told never go back
/// (a leader's token is greater than every earlier leader's), whichever
/// node answered, across kills, partitions and restarts.
fn observers(input: &Input<'_>) -> Check {
    let mut check = Check::new(
        "observers",
        "election observers were told leaders in log order: tokens and log indexes never went back",
    );
    let mut last: BTreeMap<(usize, &str), (u64, u64, &Op)> = BTreeMap::new();
    let mut told = input.ops.iter().filter(|op| matches!(op.kind, OpKind::Observe)).collect::<Vec<_>>();
    told.sort_by_key(|op| (op.complete_us, op.id));
    for op in told {
        let Outcome::Observed { token, index } = op.outcome else { continue };
        let token = token.unwrap_or(0);
        let slot = (op.client, op.key.as_str());
        if let Some((last_token, last_index, before)) = last.get(&slot) {
            if token != 0 && token < *last_token {
                check.violation(format!(
                    "leader token {token} told after {last_token}: {} after {}",
                    describe(op),
                    describe(before)
                ));
            }
            if index < *last_index {
                check.violation(format!(
                    "log index {index} told after {last_index}: {} after {}",
                    describe(op),
                    describe(before)
                ));
            }
        }
        let entry = last.entry(slot).or_insert((0, 0, op));
        *entry = (entry.0.max(token), index, op);
    }
    check
}

fn describe(op: &Op) -> String {
    format!(
        "op {} (client {}, {:?} at {:.3}s..{:.3}s, {:?})",
        op.id,
        op.client,
        op.kind,
        op.invoke_us as f64 / 1e6,
        op.complete_us as f64 / 1e6,
        op.outcome
    )
}

/// The granted acquires: (token, lease_ms, op).
fn grants<'a>(ops: &'a [Op]) -> impl Iterator<Item = (u64, u64, &'a Op)> + 'a {
    ops.iter().filter_map(|op| match op.outcome {
        Outcome::Granted { token, lease_ms, .. } => Some((token, lease_ms, op)),
        _ => None,
    })
}

/// The store never accepted a token lower than one it had accepted on the
/// key, and every token it accepted had been granted to the writer.
fn fenced_store(input: &Input<'_>) -> Check {
    let mut check = Check::new(
        "fenced-store",
        "the fenced store never accepted a write whose token was lower than one it had already accepted",
    );
    let granted: BTreeSet<(usize, &str, u64)> =
        grants(input.ops).map(|(token, _, op)| (op.client, op.key.as_str(), token)).collect();
    let mut highest: BTreeMap<&str, u64> = BTreeMap::new();
    for write in input.store {
        let before = highest.get(write.key.as_str()).copied();
        if write.accepted {
            if let Some(before) = before.filter(|before| write.token < *before) {
                check.violation(format!(
                    "key {}: accepted token {} from client {} at {:.3}s after accepting {before}",
                    write.key,
                    write.token,
                    write.client,
                    write.at_us as f64 / 1e6
                ));
            }
            if !granted.contains(&(write.client, write.key.as_str(), write.token)) {
                check.violation(format!(
                    "key {}: accepted token {} from client {}, which was never granted it",
                    write.key, write.token, write.client
                ));
            }
            highest.insert(&write.key, before.map_or(write.token, |before| before.max(write.token)));
        } else if before.is_none_or(|before| write.token >= before) {
            check.violation(format!(
                "key {}: turned away token {} from client {} though the highest accepted was {before:?}",
                write.key, write.token, write.client
            ));
        }
    }
    check
}

/// No token was issued twice, and tokens increase in the real-time order
/// of grants, on every key and across keys (one counter serves them all).
fn tokens(input: &Input<'_>) -> Check {
    let mut check = Check::new(
        "tokens",
        "tokens strictly increase in grant order (per key and across keys) and no token is issued twice",
    );
    let mut owners: BTreeMap<u64, (&str, &str, &Op)> = BTreeMap::new();
    for (token, _, op) in grants(input.ops) {
        if token == 0 {
            check.violation(format!("token 0 granted: {}", describe(op)));
        }
        match owners.get(&token) {
            Some((key, owner, first)) if (*key, *owner) != (op.key.as_str(), op.owner.as_str()) => {
                check.violation(format!(
                    "token {token} issued twice: to {owner} on {key} ({}) and to {} on {} ({})",
                    describe(first),
                    op.owner,
                    op.key,
                    describe(op)
                ));
            }
            Some(_) => {}
            None => {
                owners.insert(token, (&op.key, &op.owner, op));
            }
        }
    }
    // A grant that completed before another was invoked came first, so its
    // token must be lower (or the same grant, retried by its owner).
    let mut by_complete: Vec<(u64, u64, &Op)> =
        grants(input.ops).map(|(t, _, op)| (op.complete_us, t, op)).collect();
    by_complete.sort_by_key(|(complete, token, _)| (*complete, *token));
    let mut prefix_max: Vec<(u64, &Op)> = Vec::with_capacity(by_complete.len());
    for (_, token, op) in &by_complete {
        let best = match prefix_max.last() {
            Some((max, best)) if *max >= *token => (*max, *best),
            _ => (*token, *op),
        };
        prefix_max.push(best);
    }
    // An acquire by the same owner on the same key that got no answer may have
    // been granted already; a later acquire is then answered with that
    // existing token (the answer says so), issued before the later acquire
    // was even sent. Such an earlier acquire must exist.
    let earlier_attempts: BTreeSet<(&str, &str, u64)> = input
        .ops
        .iter()
        .filter(|op| {
            matches!(op.kind, OpKind::Acquire { .. } | OpKind::AcquireShared { .. })
                && matches!(op.outcome, Outcome::Unknown { .. } | Outcome::Granted { .. })
        })
        .map(|op| (op.owner.as_str(), op.key.as_str(), op.invoke_us))
        .collect();
    for (token, _, op) in grants(input.ops) {
        if matches!(op.outcome, Outcome::Granted { existing: true, .. }) {
            let from = (op.owner.as_str(), op.key.as_str(), 0);
            let to = (op.owner.as_str(), op.key.as_str(), op.invoke_us);
            if earlier_attempts.range(from..to).next().is_none() {
                check.violation(format!(
                    "token {token} granted as already held, with no earlier acquire by its owner: {}",
                    describe(op)
                ));
            }
            continue;
        }
        let before = by_complete.partition_point(|(complete, _, _)| *complete < op.invoke_us);
        let Some((max, earlier)) = before.checked_sub(1).and_then(|i| prefix_max.get(i)) else { continue };
        let same_grant = *max == token && earlier.key == op.key && earlier.owner == op.owner;
        if *max >= token && !same_grant {
            check.violation(format!(
                "token {token} granted after token {max} was: {} came after {}",
                describe(op),
                describe(earlier)
            ));
        }
    }
    // The cluster's counter never forgets a grant it answered.
    if let Some(convergence) = input.convergence.filter(|c| c.converged_ms.is_some()) {
        let issued = grants(input.ops).map(|(token, _, _)| token).max().unwrap_or(0);
        for table in &convergence.tables {
            if table.last_token < issued {
                check.violation(format!(
                    "node {} ends with last token {} but token {issued} was granted",
                    table.node, table.last_token
                ));
            }
        }
    }
    check
}

/// Evidence that `token` held a key: the op that showed it, and when the
/// op was invoked (the holding was seen no earlier than that).
#[derive(Clone, Copy)]
struct Seen<'a> {
    invoke_us: u64,
    what: Evidence<'a>,
}

#[derive(Clone, Copy)]
enum Evidence<'a> {
    Op(&'a Op),
    Listing,
}

/// No client was granted a key while an earlier grant on it was neither
/// released nor expired in the cluster's record. Tokens order the grants of
/// a key; a lock once gone never comes back. So if token `a` was seen
/// holding the key (granted, released, checked, or listed at the end) by an
/// op invoked after a grant of a higher token `b` on the key completed, `a`
/// still held the key after `b` was granted: two holders at once.
fn mutual_exclusion(input: &Input<'_>) -> Check {
    let mut check = Check::new(
        "mutual-exclusion",
        "no client was granted a key while an earlier grant on it was neither released nor expired",
    );
    let latest = sightings(input);
    let mut grants_by_key: BTreeMap<&str, Vec<(u64, &Op)>> = BTreeMap::new();
    let shared = shared_keys(input.ops);
    for (token, _, op) in grants(input.ops).filter(|(_, _, op)| !shared.contains(op.key.as_str())) {
        grants_by_key.entry(&op.key).or_default().push((token, op));
    }
    for (key, mut key_grants) in grants_by_key {
        let Some(seen) = latest.get(key) else { continue };
        key_grants.sort_by_key(|(token, _)| *token);
        // Walk tokens upwards, keeping the latest sighting of any lower one.
        let mut sightings = seen.iter().peekable();
        let mut lower: Option<(u64, Seen<'_>)> = None;
        for (token, grant) in key_grants {
            while let Some((seen_token, sighting)) = sightings.next_if(|(seen_token, _)| **seen_token < token)
            {
                if lower.is_none_or(|(_, best)| sighting.invoke_us > best.invoke_us) {
                    lower = Some((*seen_token, *sighting));
                }
            }
            let Some((old, sighting)) = lower else { continue };
            if sighting.invoke_us > grant.complete_us {
                check.violation(format!(
                    "key {key}: token {token} was granted ({}) while token {old} still held it, as {} showed at {:.3}s",
                    describe(grant),
                    sighting.describe(),
                    sighting.invoke_us as f64 / 1e6
                ));
            }
        }
    }
    check
}

/// Per key, per token: the latest invoke of an op that saw the token hold
/// the key (a grant, a release answered released, a check answered holds,
/// an applied proclaim, the final listing).
fn sightings<'a>(input: &Input<'a>) -> BTreeMap<&'a str, BTreeMap<u64, Seen<'a>>> {
    let mut latest: BTreeMap<&str, BTreeMap<u64, Seen<'_>>> = BTreeMap::new();
    let mut observations: Vec<(&str, u64, Seen<'_>)> = Vec::new();
    for op in input.ops {
        let token = match (&op.kind, &op.outcome) {
            (_, Outcome::Granted { token, .. }) => *token,
            (OpKind::Release { token }, Outcome::Released) => *token,
            (OpKind::Check { token }, Outcome::Holds) => *token,
            // Applied through the log while the token held the key.
            (OpKind::Proclaim { token }, Outcome::Proclaimed) => *token,
            _ => continue,
        };
        observations.push((op.key.as_str(), token, Seen { invoke_us: op.invoke_us, what: Evidence::Op(op) }));
    }
    if let Some(listing) = input.listing {
        for lock in &listing.locks {
            let seen = Seen { invoke_us: listing.invoke_us, what: Evidence::Listing };
            observations.push((lock.key.as_str(), lock.token, seen));
        }
    }
    for (key, token, seen) in observations {
        let slot = latest.entry(key).or_default().entry(token).or_insert(seen);
        if seen.invoke_us > slot.invoke_us {
            *slot = seen;
        }
    }
    latest
}

impl Seen<'_> {
    fn describe(&self) -> String {
        match self.what {
            Evidence::Op(op) => describe(op),
            Evidence::Listing => "the final listing".to_owned(),
        }
    }
}

/// The keys some client acquired shared: read-write locks and semaphores.
fn shared_keys(ops: &[Op]) -> BTreeSet<&str> {
    ops.iter()
        .filter(|op| matches!(op.kind, OpKind::AcquireShared { .. }))
        .map(|op| op.key.as_str())
        .collect()
}

/// How each shared grant holds its key: (key, token) to share and permits.
fn shares(ops: &[Op]) -> BTreeMap<(&str, u64), (ShareKind, u32)> {
    ops.iter()
        .filter_map(|op| match (&op.kind, &op.outcome) {
            (OpKind::AcquireShared { share, permits, .. }, Outcome::Granted { token, .. }) => {
                Some(((op.key.as_str(), *token), (*share, *permits)))
            }
            _ => None,
        })
        .collect()
}

/// Whether a holder in `share` (of `permits`) may hold beside `others`:
/// readers beside readers only, a writer beside no one, at most `permits`
/// permits. None: it may; else what it broke.
fn shared_conflict(share: ShareKind, permits: u32, others: &[(u64, ShareKind)]) -> Option<String> {
    match share {
        ShareKind::Write if !others.is_empty() => Some(format!("a writer beside {others:?}")),
        ShareKind::Read => others
            .iter()
            .find(|(_, other)| *other != ShareKind::Read)
            .map(|(token, other)| format!("a reader beside token {token} ({other:?})")),
        ShareKind::Permit if others.len() + 1 > permits as usize => {
            Some(format!("{} holders of a semaphore of {permits}: {others:?} and this one", others.len() + 1))
        }
        _ => None,
    }
}

/// The holders of read-write locks and semaphores kept to their kind: a
/// writer alone, readers only with readers, never more permits than the
/// semaphore has. The evidence is as for mutual exclusion: a lower token
/// seen holding the key by an op invoked after a grant completed held it
/// when that grant was made, beside it.
fn shared_exclusion(input: &Input<'_>) -> Check {
    let mut check = Check::new(
        "shared-exclusion",
        "read-write locks had one writer alone or only readers, and semaphores never more holders than permits",
    );
    let latest = sightings(input);
    let shares = shares(input.ops);
    for (token, _, grant) in grants(input.ops) {
        let key = grant.key.as_str();
        let Some((share, permits)) = shares.get(&(key, token)).copied() else { continue };
        let Some(seen) = latest.get(key) else { continue };
        let beside: Vec<(u64, ShareKind)> = seen
            .range(..token)
            .filter(|(_, sighting)| sighting.invoke_us > grant.complete_us)
            .map(|(old, _)| (*old, shares.get(&(key, *old)).map_or(ShareKind::Write, |(share, _)| *share)))
            .collect();
        if let Some(broken) = shared_conflict(share, permits, &beside) {
            check
                .violation(format!("key {key}: token {token} was granted ({}) as {broken}", describe(grant)));
        }
    }
    check
}

/// No lock left the table before its lease ran out, counted from when its
/// holder sent the acquire (leases.md's guarantee): a grant of a higher
/// token on the key that completed before the earlier grant's invoke plus
/// its lease, with no release of the earlier token sent by then, means the
/// earlier lock expired early. Each lock cut short counts once. Locks whose
/// span (from the earlier acquire to the later grant) meets a window of
/// skewed clocks go to the second, unenforced check.
fn lease_expiry(input: &Input<'_>) -> (Check, Check) {
    let mut check = Check::new(
        "lease-expiry",
        "no lock expired before its lease ran out, counted from when its acquire was sent",
    );
    let mut skewed = Check::new(
        "lease-under-skew",
        "locks cut short while nodes ran with skewed clocks: what the fault does, fencing must still hold",
    );
    skewed.enforced = false;
    let in_skew =
        |from: u64, to: u64| input.skew_windows.iter().any(|(start, end)| from <= *end && *start <= to);
    let mut releases: BTreeMap<(&str, u64), u64> = BTreeMap::new();
    for op in input.ops {
        if let OpKind::Release { token } = op.kind {
            let first = releases.entry((op.key.as_str(), token)).or_insert(op.invoke_us);
            *first = (*first).min(op.invoke_us);
        }
    }
    let mut by_key: BTreeMap<&str, Vec<(u64, u64, &Op)>> = BTreeMap::new();
    for (token, lease_ms, op) in grants(input.ops) {
        by_key.entry(&op.key).or_default().push((token, lease_ms, op));
    }
    let shared = shared_keys(input.ops);
    let shares = shares(input.ops);
    for (key, mut key_grants) in by_key {
        if shared.contains(key) {
            shared_leases(key, &key_grants, &shares, &releases, |from, to, message| {
                let target = if in_skew(from, to) { &mut skewed } else { &mut check };
                target.violation(message);
            });
            continue;
        }
        key_grants.sort_by_key(|(_, _, op)| op.invoke_us);
        let longest_us =
            key_grants.iter().map(|(_, lease, _)| lease.saturating_mul(1_000)).max().unwrap_or(0);
        // One violation per lock cut short, named with the first grant
        // that came too early.
        let mut by_complete: Vec<&(u64, u64, &Op)> = key_grants.iter().collect();
        by_complete.sort_by_key(|(_, _, op)| op.complete_us);
        let mut reported = BTreeSet::new();
        for &&(later, _, grant) in &by_complete {
            let from = grant.complete_us.saturating_sub(longest_us);
            let first = key_grants.partition_point(|(_, _, op)| op.invoke_us < from);
            for &(earlier, lease_ms, holder) in &key_grants[first..] {
                if holder.invoke_us >= grant.complete_us {
                    break;
                }
                if earlier >= later || reported.contains(&earlier) {
                    continue;
                }
                let lease_us = (lease_ms as f64 * 1_000.0 * (1.0 - LEASE_MARGIN)) as u64;
                let ends_us = holder.invoke_us.saturating_add(lease_us);
                let released = releases.get(&(key, earlier)).is_some_and(|sent| *sent < grant.complete_us);
                if grant.complete_us < ends_us && !released {
                    reported.insert(earlier);
                    let target =
                        if in_skew(holder.invoke_us, grant.complete_us) { &mut skewed } else { &mut check };
                    target.violation(format!(
                        "key {key}: token {later} was granted at {:.3}s ({}), but token {earlier}'s lease ran to {:.3}s ({}) and it was not released",
                        grant.complete_us as f64 / 1e6,
                        describe(grant),
                        ends_us as f64 / 1e6,
                        describe(holder)
                    ));
                }
            }
        }
    }
    (check, skewed)
}

/// [`lease_expiry`] on a read-write lock or a semaphore: when a grant
/// completed, the earlier holders whose leases (from their sends) still
/// ran and that had sent no release must fit beside it (a writer alone,
/// readers with readers, at most the permits): else one of them was cut
/// short. One violation per grant that came too early; `report` takes the
/// span from the earliest such holder's acquire to the grant.
fn shared_leases(
    key: &str,
    key_grants: &[(u64, u64, &Op)],
    shares: &BTreeMap<(&str, u64), (ShareKind, u32)>,
    releases: &BTreeMap<(&str, u64), u64>,
    mut report: impl FnMut(u64, u64, String),
) {
    for &(later, _, grant) in key_grants {
        let Some((share, permits)) = shares.get(&(key, later)).copied() else { continue };
        let mut alive: Vec<(u64, ShareKind)> = Vec::new();
        let mut first_invoke = grant.complete_us;
        for &(earlier, lease_ms, holder) in key_grants {
            if earlier >= later || holder.invoke_us >= grant.complete_us {
                continue;
            }
            let lease_us = (lease_ms as f64 * 1_000.0 * (1.0 - LEASE_MARGIN)) as u64;
            let ends_us = holder.invoke_us.saturating_add(lease_us);
            let released = releases.get(&(key, earlier)).is_some_and(|sent| *sent < grant.complete_us);
            if grant.complete_us < ends_us && !released && !alive.iter().any(|(token, _)| *token == earlier) {
                let kind = shares.get(&(key, earlier)).map_or(ShareKind::Write, |(kind, _)| *kind);
                alive.push((earlier, kind));
                first_invoke = first_invoke.min(holder.invoke_us);
            }
        }
        if let Some(broken) = shared_conflict(share, permits, &alive) {
            report(
                first_invoke,
                grant.complete_us,
                format!(
                    "key {key}: token {later} was granted at {:.3}s ({}) as {broken}, whose leases still ran and which were not released",
                    grant.complete_us as f64 / 1e6,
                    describe(grant)
                ),
            );
        }
    }
}

/// The healed cluster served again and every node ended with the same
/// table, within the bound.
fn convergence(input: &Input<'_>) -> Check {
    let mut check = Check::new(
        "convergence",
        "after the faults heal, every node serves again and ends with an identical lock table within the bound",
    );
    let Some(convergence) = input.convergence else {
        check.violation("the healed cluster was not watched".to_owned());
        return check;
    };
    if convergence.serving_ms.is_none() {
        check.violation(format!("no lock could be granted within {} ms of healing", convergence.bound_ms));
    }
    if convergence.converged_ms.is_none() {
        check.violation(format!(
            "the nodes' tables were not identical within {} ms of healing; last read: {}",
            convergence.bound_ms,
            serde_json::to_string(&convergence.tables).unwrap_or_default()
        ));
    }
    check
}

#[cfg(test)]
mod tests;
