//! The checker on hand-made histories: a clean run passes every check, and
//! each kind of violation is reported by the check that owns it.

use super::*;
use crate::converge::{Listed, NodeTable};

const MS: u64 = 1_000;

/// A history under construction, with times in milliseconds.
#[derive(Default)]
struct History {
    ops: Vec<Op>,
    store: Vec<StoreWrite>,
    highest: BTreeMap<String, u64>,
}

impl History {
    fn push(
        &mut self,
        client: usize,
        key: &str,
        invoke_ms: u64,
        complete_ms: u64,
        kind: OpKind,
        outcome: Outcome,
    ) {
        self.ops.push(Op {
            id: self.ops.len() as u64,
            client,
            owner: format!("owner-{client}"),
            key: key.to_owned(),
            invoke_us: invoke_ms * MS,
            complete_us: complete_ms * MS,
            kind,
            outcome,
        });
    }

    fn grant(&mut self, client: usize, key: &str, invoke_ms: u64, complete_ms: u64, token: u64) {
        let kind = OpKind::Acquire { lease_ms: 1_000, wait_ms: 0 };
        let outcome = Outcome::Granted { token, lease_ms: 1_000, existing: false };
        self.push(client, key, invoke_ms, complete_ms, kind, outcome);
    }

    fn release(
        &mut self,
        client: usize,
        key: &str,
        invoke_ms: u64,
        complete_ms: u64,
        token: u64,
        outcome: Outcome,
    ) {
        self.push(client, key, invoke_ms, complete_ms, OpKind::Release { token }, outcome);
    }

    /// A write the way the real store decides it.
    fn write(&mut self, client: usize, key: &str, at_ms: u64, token: u64) {
        let highest_before = self.highest.get(key).copied();
        let accepted = highest_before.is_none_or(|highest| token >= highest);
        if accepted {
            self.highest.insert(key.to_owned(), token);
        }
        self.store_write(client, key, at_ms, token, accepted, highest_before);
    }

    fn store_write(
        &mut self,
        client: usize,
        key: &str,
        at_ms: u64,
        token: u64,
        accepted: bool,
        highest_before: Option<u64>,
    ) {
        let outcome = if accepted {
            Outcome::Accepted
        } else {
            Outcome::Rejected { highest: highest_before.unwrap_or(0) }
        };
        self.push(client, key, at_ms, at_ms, OpKind::Write { token }, outcome);
        self.store.push(StoreWrite {
            key: key.to_owned(),
            token,
            client,
            at_us: at_ms * MS,
            accepted,
            highest_before,
        });
    }

    /// One whole cycle: grant, write, release.
    fn cycle(&mut self, client: usize, key: &str, start_ms: u64, token: u64) {
        self.grant(client, key, start_ms, start_ms + 5, token);
        self.write(client, key, start_ms + 6, token);
        self.release(client, key, start_ms + 7, start_ms + 12, token, Outcome::Released);
    }
}

fn listing(at_ms: u64, locks: &[(&str, u64, usize)]) -> Listing {
    Listing {
        invoke_us: at_ms * MS,
        complete_us: (at_ms + 5) * MS,
        locks: locks
            .iter()
            .map(|(key, token, client)| Listed {
                key: (*key).to_owned(),
                token: *token,
                owner: format!("owner-{client}"),
            })
            .collect(),
    }
}

fn converged(last_token: u64) -> Convergence {
    let table = |node| NodeTable {
        node,
        applied_index: 40,
        commit_index: 40,
        locks: 1,
        last_token,
        holders: vec![("k".to_owned(), Some(last_token))],
    };
    Convergence {
        bound_ms: 20_000,
        healed_us: 0,
        leader_ms: Some(10),
        serving_ms: Some(30),
        converged_ms: Some(80),
        listing: None,
        tables: vec![table(1), table(2), table(3)],
    }
}

/// Runs the checker and returns the checks by name.
fn run(
    history: &History,
    listing: Option<&Listing>,
    convergence: Option<&Convergence>,
    skew_windows: &[(u64, u64)],
) -> BTreeMap<&'static str, Check> {
    let input = Input { ops: &history.ops, store: &history.store, listing, convergence, skew_windows };
    check(&input).into_iter().map(|check| (check.name, check)).collect()
}

fn violations(checks: &BTreeMap<&'static str, Check>) -> Vec<(&'static str, usize)> {
    checks.values().filter(|check| !check.passed()).map(|check| (check.name, check.violations)).collect()
}

/// A run with contention, a waiting acquire, a holder that paused past its
/// lease and was fenced off, a lock still held at the end, and a retried
/// acquire that got its own token back.
fn clean() -> (History, Listing, Convergence) {
    let mut h = History::default();
    h.cycle(0, "k", 0, 1);
    h.cycle(1, "j", 2, 2);
    // Client 2 waits while client 0 holds k again, and gets it after the
    // release.
    h.grant(0, "k", 100, 105, 3);
    h.write(0, "k", 106, 3);
    h.push(
        2,
        "k",
        101,
        130,
        OpKind::Acquire { lease_ms: 1_000, wait_ms: 500 },
        Outcome::Granted { token: 4, lease_ms: 1_000, existing: false },
    );
    h.release(0, "k", 110, 120, 3, Outcome::Released);
    h.push(2, "k", 131, 135, OpKind::Check { token: 4 }, Outcome::Holds);
    h.write(2, "k", 136, 4);
    h.release(2, "k", 137, 140, 4, Outcome::Released);
    // Client 1 overstays: its lease (sent at 200) runs to 1,200; client 0
    // gets k at 1,300 and writes; client 1 wakes and is turned away.
    h.grant(1, "k", 200, 205, 5);
    h.push(1, "k", 206, 1_600, OpKind::Pause { token: 5, ms: 1_394 }, Outcome::Paused);
    h.grant(0, "k", 1_290, 1_300, 6);
    h.write(0, "k", 1_301, 6);
    h.release(0, "k", 1_302, 1_305, 6, Outcome::Released);
    h.write(1, "k", 1_601, 5);
    h.release(1, "k", 1_602, 1_605, 5, Outcome::NotHeld);
    // An acquire with no answer, then the same owner's retry gets the same
    // token twice (a retried grant), and still holds it at the end.
    h.push(
        2,
        "k",
        1_700,
        4_700,
        OpKind::Acquire { lease_ms: 1_000, wait_ms: 0 },
        Outcome::Unknown { error: "timeout".into() },
    );
    h.grant(2, "k", 4_800, 4_805, 7);
    h.grant(2, "k", 4_810, 4_815, 7);
    h.write(2, "k", 4_816, 7);
    // A try-acquire turned away by a stale leader's Held is no evidence.
    h.push(
        0,
        "k",
        4_900,
        4_901,
        OpKind::Acquire { lease_ms: 1_000, wait_ms: 0 },
        Outcome::Held { holder_token: Some(6) },
    );
    (h, listing(5_000, &[("k", 7, 2)]), converged(7))
}

#[test]
fn a_clean_history_passes_every_check() {
    let (history, listing, convergence) = clean();
    let checks = run(&history, Some(&listing), Some(&convergence), &[]);
    assert_eq!(checks.len(), 7);
    assert!(violations(&checks).is_empty(), "{checks:#?}");
    let rejected = history.store.iter().filter(|write| !write.accepted).count();
    assert_eq!(rejected, 1, "the overstaying holder was fenced off");
}

#[test]
fn the_store_accepting_a_lower_token_is_reported() {
    let (mut history, listing, convergence) = clean();
    // A broken store takes client 1's stale token 5 after 7.
    history.grant(1, "k", 5_100, 5_105, 8);
    history.store_write(1, "k", 5_106, 5, true, Some(7));
    let checks = run(&history, Some(&listing), Some(&convergence), &[]);
    let store = &checks["fenced-store"];
    assert!(store.fails_run());
    assert!(
        store.examples.iter().any(|e| e.contains("accepted token 5") && e.contains("after accepting 7")),
        "{store:?}"
    );
}

#[test]
fn the_store_accepting_a_token_never_granted_or_refusing_a_good_one_is_reported() {
    let (mut history, listing, convergence) = clean();
    history.store_write(0, "k", 5_100, 99, true, Some(7));
    history.store_write(1, "j", 5_200, 100, false, Some(2));
    let checks = run(&history, Some(&listing), Some(&convergence), &[]);
    let store = &checks["fenced-store"];
    assert_eq!(store.violations, 2, "{store:?}");
    assert!(store.examples[0].contains("never granted"));
    assert!(store.examples[1].contains("turned away token 100"));
}

#[test]
fn a_token_issued_twice_is_reported() {
    let (mut history, listing, convergence) = clean();
    // Token 2 went to client 1 on j; here it also goes to client 0 on j.
    history.grant(0, "j", 10, 15, 2);
    let checks = run(&history, Some(&listing), Some(&convergence), &[]);
    assert!(
        checks["tokens"].examples.iter().any(|e| e.contains("token 2 issued twice")),
        "{:?}",
        checks["tokens"]
    );
}

#[test]
fn a_token_lower_than_an_earlier_grant_is_reported_on_any_key() {
    let (mut history, listing, convergence) = clean();
    // Token 10 was granted on one key before an acquire of another key was
    // invoked, which still got the lower token 9: one counter serves every
    // key, so the order is wrong though no token was issued twice.
    history.grant(2, "other", 2_000, 2_005, 10);
    history.grant(1, "fresh", 2_100, 2_105, 9);
    let checks = run(&history, Some(&listing), Some(&convergence), &[]);
    let tokens = &checks["tokens"];
    assert!(tokens.examples.iter().any(|e| e.contains("token 9 granted after token 10")), "{tokens:?}");
    assert!(!tokens.examples.iter().any(|e| e.contains("issued twice")), "{tokens:?}");
}

#[test]
fn a_retried_acquire_answered_with_its_earlier_unanswered_token_is_not_out_of_order() {
    let kind = OpKind::Acquire { lease_ms: 1_000, wait_ms: 0 };
    let unanswered = Outcome::Unknown { error: "timed out".to_owned() };
    let existing = Outcome::Granted { token: 9, lease_ms: 1_000, existing: true };
    let (mut history, listing, convergence) = clean();
    // Client 1's first acquire got no answer, yet was granted token 9. Token
    // 10 then went to client 2. Client 1's retry, same owner, is answered
    // with its existing token 9, and says so: correct, though 9 < 10.
    history.push(1, "fresh", 2_000, 2_500, kind.clone(), unanswered.clone());
    history.grant(2, "other", 2_100, 2_105, 10);
    history.push(1, "fresh", 2_600, 2_605, kind.clone(), existing.clone());
    let checks = run(&history, Some(&listing), Some(&convergence), &[]);
    let tokens = &checks["tokens"];
    assert!(!tokens.examples.iter().any(|e| e.contains("token 9 granted")), "{tokens:?}");
    // A fresh grant (not marked existing) after the same unanswered attempt
    // must still be in order.
    let (mut history, listing, convergence) = clean();
    history.push(1, "fresh", 2_000, 2_500, kind.clone(), unanswered);
    history.grant(2, "other", 2_100, 2_105, 10);
    history.grant(1, "fresh", 2_600, 2_605, 9);
    let checks = run(&history, Some(&listing), Some(&convergence), &[]);
    assert!(checks["tokens"].examples.iter().any(|e| e.contains("token 9 granted after token 10")));
    // A grant marked existing with no earlier acquire by its owner is a lie.
    let (mut history, listing, convergence) = clean();
    history.grant(2, "other", 2_100, 2_105, 10);
    history.push(1, "fresh", 2_600, 2_605, kind, existing);
    let checks = run(&history, Some(&listing), Some(&convergence), &[]);
    let tokens = &checks["tokens"];
    assert!(tokens.examples.iter().any(|e| e.contains("granted as already held")), "{tokens:?}");
}

#[test]
fn a_node_whose_counter_is_behind_the_grants_is_reported() {
    let (history, listing, mut convergence) = clean();
    convergence.tables[1].last_token = 5;
    let checks = run(&history, Some(&listing), Some(&convergence), &[]);
    assert!(checks["tokens"].examples.iter().any(|e| e.contains("node 2 ends with last token 5")));
}

#[test]
fn a_grant_while_the_previous_holder_still_held_is_reported() {
    // Each of three kinds of evidence that token 1 still held k after
    // token 2 was granted: a successful release, a check, the final list.
    for evidence in ["release", "check", "listing"] {
        let mut h = History::default();
        h.grant(0, "k", 0, 10, 1);
        h.write(0, "k", 11, 1);
        h.grant(1, "k", 20, 30, 2);
        h.write(1, "k", 31, 2);
        let mut final_locks = vec![];
        match evidence {
            "release" => h.release(0, "k", 40, 50, 1, Outcome::Released),
            "check" => h.push(0, "k", 40, 45, OpKind::Check { token: 1 }, Outcome::Holds),
            _ => final_locks.push(("k", 1, 0)),
        }
        let listing = listing(100, &final_locks);
        let checks = run(&h, Some(&listing), Some(&converged(2)), &[]);
        let exclusion = &checks["mutual-exclusion"];
        assert_eq!(exclusion.violations, 1, "{evidence}: {exclusion:?}");
        assert!(exclusion.examples[0].contains("token 2 was granted"), "{evidence}: {exclusion:?}");
        assert!(exclusion.examples[0].contains("token 1 still held it"), "{evidence}: {exclusion:?}");
    }
}

#[test]
fn evidence_that_overlaps_the_grant_is_not_a_violation() {
    // The release of token 1 was invoked before the grant of token 2
    // completed: it may have taken effect first.
    let mut h = History::default();
    h.grant(0, "k", 0, 10, 1);
    h.grant(1, "k", 20, 60, 2);
    h.release(0, "k", 40, 50, 1, Outcome::Released);
    let checks = run(&h, Some(&listing(100, &[])), Some(&converged(2)), &[]);
    assert!(checks["mutual-exclusion"].passed(), "{:?}", checks["mutual-exclusion"]);
    assert!(checks["lease-expiry"].passed(), "{:?}", checks["lease-expiry"]);
}

#[test]
fn a_lock_expired_before_its_lease_is_reported_and_enforced_outside_skew_windows() {
    let mut h = History::default();
    // Token 1's lease (1 s from 0) runs to about 980 ms; token 5 is granted
    // at 500 ms though token 1 was never released.
    h.grant(0, "k", 0, 10, 1);
    h.grant(1, "k", 400, 500, 5);
    // A second early grant after the same lock counts no more.
    h.release(1, "k", 510, 520, 5, Outcome::Released);
    h.grant(2, "k", 530, 540, 6);
    // Elsewhere, token 3 is released before token 4 comes: fine.
    h.grant(0, "j", 0, 10, 3);
    h.release(0, "j", 100, 110, 3, Outcome::Unknown { error: "timeout".into() });
    h.grant(1, "j", 120, 130, 4);
    let listing = listing(2_000, &[]);
    let enforced = run(&h, Some(&listing), Some(&converged(6)), &[]);
    let lease = &enforced["lease-expiry"];
    assert_eq!(lease.violations, 1, "{lease:?}");
    assert!(
        lease.examples[0].contains("token 5 was granted") && lease.examples[0].contains("token 1's lease")
    );
    assert!(lease.fails_run());
    assert_eq!(violations(&enforced), vec![("lease-expiry", 1)]);
    assert!(!enforced.contains_key("lease-under-skew"), "no skew, no such check");
    // The same history with clocks skewed from 0.3 s to 0.45 s: the lock cut
    // short spans that window, so it is reported apart and fails nothing.
    let skewed = run(&h, Some(&listing), Some(&converged(6)), &[(300 * MS, 450 * MS)]);
    assert!(skewed["lease-expiry"].passed(), "{:?}", skewed["lease-expiry"]);
    assert_eq!(skewed["lease-under-skew"].violations, 1);
    assert!(!skewed["lease-under-skew"].fails_run(), "with skewed clocks the check only reports");
    assert!(skewed["mutual-exclusion"].passed(), "the cluster's own record stayed exclusive");
    // A window long before the lock leaves it to the enforced check.
    let elsewhere = run(&h, Some(&listing), Some(&converged(6)), &[(1_500 * MS, 1_600 * MS)]);
    assert!(elsewhere["lease-expiry"].fails_run());
    assert!(elsewhere["lease-under-skew"].passed());
}

#[test]
fn a_retried_grant_released_under_its_holder_is_reported() {
    // Client 0 sends an acquire and hangs up before the answer; the leader
    // grants it token 1. The retry, on a new connection, is told Granted 1
    // (existing). Then the grant nobody received is released as a ghost,
    // and client 1 gets the key at 150 ms, while client 0 still works under
    // a lease that runs to about 1,000 ms. Its write is turned away and its
    // release finds nothing: fencing held, but the lock did not.
    let kind = OpKind::Acquire { lease_ms: 1_000, wait_ms: 0 };
    let mut h = History::default();
    h.push(0, "k", 0, 1, kind.clone(), Outcome::Unknown { error: "hung up".into() });
    h.push(0, "k", 2, 10, kind, Outcome::Granted { token: 1, lease_ms: 1_000, existing: true });
    h.grant(1, "k", 100, 150, 2);
    h.write(1, "k", 151, 2);
    h.write(0, "k", 300, 1);
    h.release(0, "k", 301, 305, 1, Outcome::NotHeld);
    h.release(1, "k", 400, 405, 2, Outcome::Released);
    let checks = run(&h, Some(&listing(1_000, &[])), Some(&converged(2)), &[]);
    assert_eq!(violations(&checks), vec![("lease-expiry", 1)], "{checks:#?}");
    let lease = &checks["lease-expiry"];
    assert!(lease.examples[0].contains("token 2 was granted"), "{lease:?}");
    assert!(lease.examples[0].contains("token 1's lease"), "{lease:?}");
    assert!(lease.examples[0].contains("existing: true"), "{lease:?}");
}

#[test]
fn a_cluster_that_does_not_serve_or_converge_is_reported() {
    let (history, listing, mut convergence) = clean();
    convergence.serving_ms = None;
    convergence.converged_ms = None;
    convergence.tables[2].applied_index = 39;
    let checks = run(&history, Some(&listing), Some(&convergence), &[]);
    let check = &checks["convergence"];
    assert_eq!(check.violations, 2, "{check:?}");
    assert!(check.examples[1].contains("\"applied_index\":39"));
    let unwatched = run(&history, Some(&listing), None, &[]);
    assert!(unwatched["convergence"].fails_run());
}

#[test]
fn only_the_first_violations_are_listed_but_all_are_counted() {
    let mut h = History::default();
    h.grant(0, "k", 0, 10, 1);
    for i in 0..30 {
        h.grant(1, &format!("key-{i}"), 20 + i, 30 + i, 1);
    }
    let checks = run(&h, Some(&listing(1_000, &[])), Some(&converged(1)), &[]);
    let tokens = &checks["tokens"];
    assert!(tokens.violations >= 30);
    assert_eq!(tokens.examples.len(), LISTED_MAX);
}

#[test]
fn an_observer_told_an_older_leader_or_index_after_a_newer_one_is_caught() {
    let (mut history, listing, convergence) = clean();
    let observed = |token: Option<u64>, index| Outcome::Observed { token, index };
    history.push(9, "e", 10, 11, OpKind::Observe, observed(Some(3), 10));
    history.push(9, "e", 12, 13, OpKind::Observe, observed(None, 12));
    history.push(9, "e", 14, 15, OpKind::Observe, observed(Some(5), 14));
    // Another observer has its own order.
    history.push(8, "e", 14, 16, OpKind::Observe, observed(Some(3), 10));
    let checks = run(&history, Some(&listing), Some(&convergence), &[]);
    assert!(checks["observers"].passed(), "{:?}", checks["observers"]);
    history.push(9, "e", 16, 17, OpKind::Observe, observed(Some(4), 16));
    history.push(9, "e", 18, 19, OpKind::Observe, observed(Some(5), 15));
    let checks = run(&history, Some(&listing), Some(&convergence), &[]);
    assert_eq!(checks["observers"].violations, 2, "{:?}", checks["observers"]);
}

#[test]
fn a_proclaim_applied_under_an_old_token_after_a_newer_grant_is_two_holders() {
    let mut h = History::default();
    h.grant(0, "e", 0, 10, 1);
    h.grant(1, "e", 20, 30, 2);
    // Token 1 proclaimed through the log after token 2 was granted.
    h.push(0, "e", 40, 45, OpKind::Proclaim { token: 1 }, Outcome::Proclaimed);
    let checks = run(&h, Some(&listing(1_000, &[])), Some(&converged(2)), &[]);
    assert!(checks["mutual-exclusion"].fails_run(), "{:?}", checks["mutual-exclusion"]);
}

impl History {
    /// A shared grant of `key` under `token`: a reader, the writer, or a
    /// permit of `permits`.
    fn shared(
        &mut self,
        client: usize,
        key: &str,
        at_ms: (u64, u64),
        token: u64,
        share: ShareKind,
        permits: u32,
    ) {
        let kind = OpKind::AcquireShared { lease_ms: 1_000, wait_ms: 0, share, permits };
        let outcome = Outcome::Granted { token, lease_ms: 1_000, existing: false };
        self.push(client, key, at_ms.0, at_ms.1, kind, outcome);
    }
}

/// Readers together, then a writer once they released, then a semaphore
/// of 2 with two permits at once and a third after a release.
fn shared_clean() -> History {
    let mut h = History::default();
    h.shared(0, "rw", (0, 5), 1, ShareKind::Read, 0);
    h.shared(1, "rw", (2, 7), 2, ShareKind::Read, 0);
    h.push(1, "rw", 10, 12, OpKind::Check { token: 2 }, Outcome::Holds);
    h.release(0, "rw", 20, 25, 1, Outcome::Released);
    h.release(1, "rw", 21, 26, 2, Outcome::Released);
    h.shared(2, "rw", (8, 30), 3, ShareKind::Write, 0);
    h.write(2, "rw", 31, 3);
    h.release(2, "rw", 32, 35, 3, Outcome::Released);
    h.shared(0, "pool", (100, 105), 4, ShareKind::Permit, 2);
    h.shared(1, "pool", (101, 106), 5, ShareKind::Permit, 2);
    h.push(0, "pool", 110, 112, OpKind::Check { token: 4 }, Outcome::Holds);
    h.release(1, "pool", 120, 125, 5, Outcome::Released);
    h.shared(2, "pool", (102, 126), 6, ShareKind::Permit, 2);
    h.release(0, "pool", 130, 135, 4, Outcome::Released);
    h.release(2, "pool", 131, 136, 6, Outcome::Released);
    h
}

#[test]
fn readers_together_and_permits_within_the_semaphore_pass() {
    let history = shared_clean();
    let checks = run(&history, None, Some(&converged(6)), &[]);
    assert!(violations(&checks).is_empty(), "{checks:#?}");
}

#[test]
fn a_writer_beside_a_reader_and_a_third_permit_of_two_are_reported() {
    let mut history = shared_clean();
    // A writer granted while reader 7, granted before it, is seen holding
    // after the writer's grant completed.
    history.shared(0, "rw", (200, 205), 7, ShareKind::Read, 0);
    history.shared(1, "rw", (206, 210), 8, ShareKind::Write, 0);
    history.push(0, "rw", 215, 218, OpKind::Check { token: 7 }, Outcome::Holds);
    // Three permits of a semaphore of 2, all seen holding after the third.
    history.shared(0, "pool", (300, 305), 9, ShareKind::Permit, 2);
    history.shared(1, "pool", (301, 306), 10, ShareKind::Permit, 2);
    history.shared(2, "pool", (302, 307), 11, ShareKind::Permit, 2);
    history.push(0, "pool", 310, 311, OpKind::Check { token: 9 }, Outcome::Holds);
    history.release(1, "pool", 312, 315, 10, Outcome::Released);
    let checks = run(&history, None, Some(&converged(11)), &[]);
    let shared = &checks["shared-exclusion"];
    assert_eq!(shared.violations, 2, "{shared:#?}");
    assert!(
        shared.examples[0].contains("token 8") && shared.examples[0].contains("a writer beside"),
        "{shared:?}"
    );
    assert!(
        shared.examples[1].contains("token 11") && shared.examples[1].contains("3 holders"),
        "{shared:?}"
    );
    // The exclusive check does not judge shared keys: readers share.
    assert!(checks["mutual-exclusion"].passed(), "{:?}", checks["mutual-exclusion"]);
}

#[test]
fn a_reader_granted_while_a_writers_lease_still_ran_is_a_lease_cut_short() {
    let mut history = shared_clean();
    // Writer 7's lease, sent at 200, runs to about 1,180; it sent no
    // release; reader 8 is granted at 500: 7 was cut short. Reader 9
    // beside reader 8 is fine.
    history.shared(0, "rw", (200, 205), 7, ShareKind::Write, 0);
    history.shared(1, "rw", (300, 500), 8, ShareKind::Read, 0);
    history.release(1, "rw", 510, 515, 8, Outcome::Released);
    history.shared(2, "rw", (1_300, 1_305), 9, ShareKind::Read, 0);
    let checks = run(&history, None, Some(&converged(9)), &[]);
    let lease = &checks["lease-expiry"];
    assert_eq!(lease.violations, 1, "{lease:#?}");
    assert!(
        lease.examples[0].contains("token 8") && lease.examples[0].contains("a reader beside token 7"),
        "{lease:?}"
    );
    // Inside a skew window it goes to the unenforced check instead.
    let checks = run(&history, None, Some(&converged(9)), &[(100 * MS, 600 * MS)]);
    assert!(checks["lease-expiry"].passed());
    assert_eq!(checks["lease-under-skew"].violations, 1);
}
