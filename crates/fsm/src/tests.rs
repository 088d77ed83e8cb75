//! Tests of the lock table: examples of each command, properties over random
//! histories checked against a reference model, and snapshot corruption.

use fencelock_types::{
    encode_batch, pb, ApplyResult, ClusterId, Command, FencingToken, InvalidReason, Key, LeaseMs, Owner,
    Share, Value,
};
use proptest::prelude::*;
use protobuf::Message;

use crate::{LockTable, MemberAddrs, SnapshotError};

fn key(name: &str) -> Key {
    Key::new(name.as_bytes().to_vec()).unwrap()
}

fn owner(name: &str) -> Owner {
    Owner::new(name.as_bytes().to_vec()).unwrap()
}

fn lease(ms: u64) -> LeaseMs {
    LeaseMs::new(ms).unwrap()
}

fn token(value: u64) -> FencingToken {
    FencingToken::new(value).unwrap()
}

fn grant(k: &str, o: &str) -> Command {
    Command::Grant { key: key(k), lease_ms: lease(1000), owner: owner(o), value: Value::none() }
}

fn granted(table: &mut LockTable, k: &str, o: &str) -> FencingToken {
    match table.apply(grant(k, o)) {
        ApplyResult::Granted { token, .. } => token,
        other => panic!("expected Granted, got {other:?}"),
    }
}

#[test]
fn tokens_start_at_one_and_increase_across_keys() {
    let mut table = LockTable::new();
    assert_eq!(table.last_token(), None);
    assert_eq!(granted(&mut table, "a", "o1"), token(1));
    assert_eq!(granted(&mut table, "b", "o1"), token(2));
    assert_eq!(
        table.apply(Command::Release { key: key("a"), token: Some(token(1)), user: None }),
        ApplyResult::Released { token: token(1) }
    );
    assert_eq!(granted(&mut table, "a", "o2"), token(3));
    assert_eq!(table.last_token(), Some(token(3)));
    assert_eq!(table.len(), 2);
}

#[test]
fn grant_by_the_holder_is_idempotent_and_restarts_the_lease() {
    let mut table = LockTable::new();
    let first = granted(&mut table, "a", "o1");
    let retry = table.apply(Command::Grant {
        key: key("a"),
        lease_ms: lease(5000),
        owner: owner("o1"),
        value: Value::none(),
    });
    assert_eq!(retry, ApplyResult::Granted { token: first, lease_ms: lease(5000), existing: true });
    assert_eq!(table.holder(b"a").unwrap().lease_ms, lease(5000));
    // A stale retry with a shorter lease keeps the longer one.
    let stale = table.apply(Command::Grant {
        key: key("a"),
        lease_ms: lease(700),
        owner: owner("o1"),
        value: Value::none(),
    });
    assert_eq!(stale, ApplyResult::Granted { token: first, lease_ms: lease(5000), existing: true });
    assert_eq!(table.holder(b"a").unwrap().lease_ms, lease(5000));
    // No token was burnt by the retry.
    assert_eq!(table.last_token(), Some(first));
}

#[test]
fn grant_by_another_owner_is_rejected() {
    let mut table = LockTable::new();
    let first = granted(&mut table, "a", "o1");
    assert_eq!(table.apply(grant("a", "o2")), ApplyResult::GrantRejected { holder_token: first });
    assert_eq!(table.holder(b"a").unwrap().owner, owner("o1"));
}

#[test]
fn release_with_a_stale_token_cannot_free_the_successor() {
    let mut table = LockTable::new();
    let old = granted(&mut table, "a", "o1");
    table.apply(Command::Expire { key: key("a"), token: old, delay: None });
    let new = granted(&mut table, "a", "o2");
    assert_eq!(
        table.apply(Command::Release { key: key("a"), token: Some(old), user: None }),
        ApplyResult::NotFound { holder_token: Some(new) }
    );
    assert_eq!(table.holder(b"a").unwrap().token, new);
}

#[test]
fn force_release_removes_whoever_holds_the_key() {
    let mut table = LockTable::new();
    let held = granted(&mut table, "a", "o1");
    assert_eq!(
        table.apply(Command::Release { key: key("a"), token: None, user: None }),
        ApplyResult::Released { token: held }
    );
    assert_eq!(
        table.apply(Command::Release { key: key("a"), token: None, user: None }),
        ApplyResult::NotFound { holder_token: None }
    );
    assert!(table.is_empty());
}

#[test]
fn late_and_duplicate_expires_change_nothing() {
    let mut table = LockTable::new();
    let old = granted(&mut table, "a", "o1");
    assert_eq!(
        table.apply(Command::Expire { key: key("a"), token: old, delay: None }),
        ApplyResult::Expired { existed: true }
    );
    assert_eq!(
        table.apply(Command::Expire { key: key("a"), token: old, delay: None }),
        ApplyResult::Expired { existed: false }
    );
    let new = granted(&mut table, "a", "o1");
    // The same owner acquiring again after expiry gets a new, greater token.
    assert!(new > old);
    assert_eq!(
        table.apply(Command::Expire { key: key("a"), token: old, delay: None }),
        ApplyResult::Expired { existed: false }
    );
    assert_eq!(table.holder(b"a").unwrap().token, new);
}

#[test]
fn lock_delay_holds_an_expired_key_back_until_an_expire_without_delay() {
    let mut table = LockTable::new();
    let held = granted(&mut table, "a", "o1");
    assert_eq!(table.locks_of(b"o1"), 1);
    let expire = |delay| Command::Expire { key: key("a"), token: held, delay };
    assert_eq!(
        table.apply(expire(Some(lease(5_000)))),
        ApplyResult::Delayed { token: held, delay_ms: lease(5_000) }
    );
    let lock = table.holder(b"a").cloned().unwrap();
    assert!(lock.delayed && !lock.is_held_by(held) && lock.lease_ms == lease(5_000));
    // Out of its owner's quota, and granted to no one, its owner included.
    assert_eq!(table.locks_of(b"o1"), 0);
    for who in ["o1", "o2"] {
        assert_eq!(table.apply(grant("a", who)), ApplyResult::GrantRejected { holder_token: held });
    }
    // No one holds it: renewals and releases by token find nothing.
    let renew = Command::Renew { key: key("a"), token: held, lease_ms: lease(9_000), user: None };
    assert_eq!(table.apply(renew), ApplyResult::NotFound { holder_token: None });
    let release = Command::Release { key: key("a"), token: Some(held), user: None };
    assert_eq!(table.apply(release), ApplyResult::NotFound { holder_token: None });
    // A repeat of the delaying Expire changes nothing; one without a delay
    // lifts it, and the next grant gets a greater token.
    let before = table.snapshot();
    assert_eq!(table.apply(expire(Some(lease(1)))), ApplyResult::Expired { existed: false });
    assert_eq!(table.snapshot(), before);
    assert_eq!(LockTable::restore(&before).unwrap(), table, "the snapshot keeps the delay");
    assert_eq!(table.apply(expire(None)), ApplyResult::Expired { existed: true });
    assert!(table.holder(b"a").is_none());
    assert!(granted(&mut table, "a", "o2") > held);

    // The administrative force-release lifts a delay at once.
    let next = table.holder(b"a").unwrap().token;
    table.apply(Command::Expire { key: key("a"), token: next, delay: Some(lease(60_000)) });
    let force = Command::Release { key: key("a"), token: None, user: None };
    assert_eq!(table.apply(force), ApplyResult::Released { token: next });
    assert_eq!(table.locks_of(b"o2"), 0);
}

#[test]
fn renew_needs_the_current_token() {
    let mut table = LockTable::new();
    let held = granted(&mut table, "a", "o1");
    let renew = |t| Command::Renew { key: key("a"), token: t, lease_ms: lease(9000), user: None };
    assert_eq!(table.apply(renew(token(held.get() + 1))), ApplyResult::NotFound { holder_token: Some(held) });
    assert_eq!(table.holder(b"a").unwrap().lease_ms, lease(1000));
    assert_eq!(table.apply(renew(held)), ApplyResult::Renewed { token: held, lease_ms: lease(9000) });
    assert_eq!(table.holder(b"a").unwrap().lease_ms, lease(9000));
    table.apply(Command::Release { key: key("a"), token: Some(held), user: None });
    assert_eq!(table.apply(renew(held)), ApplyResult::NotFound { holder_token: None });
}

#[test]
fn with_a_user_only_its_own_locks_are_released_or_renewed() {
    let mut table = LockTable::new();
    let bobs = granted(&mut table, "a", "bob/worker-1");
    let user = |name: &str| Some(owner(name));
    let release = |user| Command::Release { key: key("a"), token: Some(bobs), user };
    let renew = |user, ms| Command::Renew { key: key("a"), token: bobs, lease_ms: lease(ms), user };
    // Alice has bob's token: it is not enough.
    assert_eq!(table.apply(release(user("alice"))), ApplyResult::Denied { token: bobs });
    assert_eq!(table.apply(renew(user("alice"), 60_000)), ApplyResult::Denied { token: bobs });
    assert_eq!(table.apply(renew(user("bo"), 60_000)), ApplyResult::Denied { token: bobs });
    assert_eq!(table.holder(b"a").unwrap().lease_ms, lease(1000));
    // A wrong token is not found, whoever asks.
    let stale = Command::Release { key: key("a"), token: Some(token(bobs.get() + 1)), user: user("alice") };
    assert_eq!(table.apply(stale), ApplyResult::NotFound { holder_token: Some(bobs) });
    // Bob renews, and cannot shorten.
    assert_eq!(
        table.apply(renew(user("bob"), 60_000)),
        ApplyResult::Renewed { token: bobs, lease_ms: lease(60_000) }
    );
    assert_eq!(
        table.apply(renew(user("bob"), 2_000)),
        ApplyResult::Renewed { token: bobs, lease_ms: lease(60_000) }
    );
    assert_eq!(table.holder(b"a").unwrap().lease_ms, lease(60_000));
    assert_eq!(table.apply(release(user("bob"))), ApplyResult::Released { token: bobs });
    // A force release (no token) names no user and frees anyone's lock.
    granted(&mut table, "a", "carol");
    let force = Command::Release { key: key("a"), token: None, user: None };
    assert!(matches!(table.apply(force), ApplyResult::Released { .. }));
}

fn value(text: &str) -> Value {
    Value::new(text.as_bytes().to_vec()).unwrap()
}

#[test]
fn a_lock_carries_its_grants_value_and_only_its_holder_proclaims_a_new_one() {
    let mut table = LockTable::new();
    let campaign = |o: &str, v: &str| Command::Grant {
        key: key("e"),
        lease_ms: lease(1000),
        owner: owner(o),
        value: value(v),
    };
    let ApplyResult::Granted { token: t1, .. } = table.apply(campaign("o1", "10.0.0.1:80")) else { panic!() };
    assert_eq!(table.holder(b"e").unwrap().value, value("10.0.0.1:80"));
    // A retried Grant keeps the value the lock has.
    assert!(matches!(table.apply(campaign("o1", "other")), ApplyResult::Granted { existing: true, .. }));
    assert_eq!(table.holder(b"e").unwrap().value, value("10.0.0.1:80"));
    // The holder proclaims; a stale token, another user, or a free key does not.
    let proclaim = |t: FencingToken, v: &str, user: Option<&str>| Command::Proclaim {
        key: key("e"),
        token: t,
        value: value(v),
        user: user.map(owner),
    };
    assert_eq!(table.apply(proclaim(t1, "10.0.0.2:80", None)), ApplyResult::Proclaimed { token: t1 });
    assert_eq!(table.holder(b"e").unwrap().value, value("10.0.0.2:80"));
    assert_eq!(table.apply(proclaim(token(99), "x", None)), ApplyResult::NotFound { holder_token: Some(t1) });
    assert_eq!(table.apply(proclaim(t1, "x", Some("o2"))), ApplyResult::Denied { token: t1 });
    assert_eq!(table.holder(b"e").unwrap().value, value("10.0.0.2:80"));
    // The value travels in the snapshot.
    assert_eq!(LockTable::restore(&table.snapshot()).unwrap(), table);
    // Held back by lock-delay: nobody holds the key, nobody proclaims.
    table.apply(Command::Expire { key: key("e"), token: t1, delay: Some(lease(500)) });
    assert_eq!(table.apply(proclaim(t1, "y", None)), ApplyResult::NotFound { holder_token: None });
    table.apply(Command::Expire { key: key("e"), token: t1, delay: None });
    assert_eq!(table.apply(proclaim(t1, "y", None)), ApplyResult::NotFound { holder_token: None });
    // The next leader's lock carries its own value.
    let ApplyResult::Granted { token: t2, .. } = table.apply(campaign("o2", "10.0.0.3:80")) else { panic!() };
    assert!(t2 > t1);
    assert_eq!(table.holder(b"e").unwrap().value, value("10.0.0.3:80"));
}

#[test]
fn values_over_the_bound_are_refused_in_commands_and_snapshots() {
    let long = vec![b'v'; fencelock_types::VALUE_LEN_MAX + 1];
    assert_eq!(Value::new(long.clone()), Err(InvalidReason::ValueTooLong));
    let mut grant =
        pb::Grant { key: b"k".to_vec(), lease_ms: 10, owner: b"o".to_vec(), ..Default::default() };
    grant.value = long.clone();
    let command = pb::Command { kind: Some(pb::Command_oneof_kind::grant(grant)), ..Default::default() };
    let batch = pb::CommandBatch { commands: vec![command].into(), ..Default::default() };
    let results = LockTable::new().apply_entry(&batch.write_to_bytes().unwrap());
    assert_eq!(results, [ApplyResult::Invalid { reason: InvalidReason::ValueTooLong }]);
    let mut record = record("k", 1);
    record.value = long;
    let body = pb::TableSnapshot { last_token: 1, locks: vec![record].into(), ..Default::default() };
    assert_eq!(
        LockTable::restore(&framed(&body)),
        Err(SnapshotError::InvalidRecord { index: 0, reason: InvalidReason::ValueTooLong })
    );
}

#[test]
fn noop_is_noop() {
    let mut table = LockTable::new();
    granted(&mut table, "a", "o1");
    let before = table.clone();
    assert_eq!(table.apply(Command::Noop), ApplyResult::Noop);
    assert_eq!(table, before);
}

#[test]
fn list_is_ordered_prefix_scoped_and_limited() {
    let mut table = LockTable::new();
    for k in ["jobs/b", "jobs/a", "job", "jobs/c", "other", "jobs0"] {
        granted(&mut table, k, "o");
    }
    let names = |prefix: &[u8], limit| -> Vec<String> {
        table.list(prefix, limit).map(|(k, _)| k.to_string()).collect()
    };
    assert_eq!(names(b"jobs/", 10), ["jobs/a", "jobs/b", "jobs/c"]);
    assert_eq!(names(b"jobs/", 2), ["jobs/a", "jobs/b"]);
    assert_eq!(names(b"job", 10), ["job", "jobs/a", "jobs/b", "jobs/c", "jobs0"]);
    assert_eq!(names(b"", 100).len(), 6);
    assert!(names(b"zzz", 10).is_empty());
    assert!(names(b"jobs/", 0).is_empty());
}

#[test]
fn entries_apply_in_order_with_one_result_per_command() {
    let mut table = LockTable::new();
    let entry = encode_batch(&[
        grant("a", "o1"),
        Command::Release { key: key("a"), token: Some(token(1)), user: None },
        grant("a", "o2"),
        Command::Noop,
    ]);
    assert_eq!(
        table.apply_entry(&entry),
        [
            ApplyResult::Granted { token: token(1), lease_ms: lease(1000), existing: false },
            ApplyResult::Released { token: token(1) },
            ApplyResult::Granted { token: token(2), lease_ms: lease(1000), existing: false },
            ApplyResult::Noop,
        ]
    );
    assert!(table.apply_entry(&encode_batch(&[])).is_empty());
}

#[test]
fn undecodable_entries_give_one_invalid_result_and_change_nothing() {
    let mut table = LockTable::new();
    granted(&mut table, "a", "o1");
    let before = table.snapshot();
    let results = table.apply_entry(&[0x0a, 0x7f, 0x01]);
    assert_eq!(results, [ApplyResult::Invalid { reason: InvalidReason::Undecodable }]);
    assert_eq!(table.snapshot(), before);
}

#[test]
fn invalid_commands_in_an_entry_do_not_stop_the_valid_ones() {
    let mut table = LockTable::new();
    let bad = pb::Command {
        kind: Some(pb::Command_oneof_kind::grant(pb::Grant {
            key: vec![b'k'; fencelock_types::KEY_LEN_MAX + 1],
            lease_ms: 5,
            owner: b"o".to_vec(),
            ..Default::default()
        })),
        ..Default::default()
    };
    let good = grant("a", "o1").to_pb();
    let entry =
        pb::CommandBatch { commands: vec![bad, good].into(), ..Default::default() }.write_to_bytes().unwrap();
    let results = table.apply_entry(&entry);
    assert_eq!(results[0], ApplyResult::Invalid { reason: InvalidReason::KeyTooLong });
    assert!(matches!(results[1], ApplyResult::Granted { .. }));
    assert_eq!(table.len(), 1);
}

#[test]
fn token_space_exhaustion_is_a_result_not_a_panic() {
    let table = LockTable { last_token: Some(token(u64::MAX)), ..LockTable::new() };
    let mut restored = LockTable::restore(&table.snapshot()).unwrap();
    assert_eq!(
        restored.apply(grant("a", "o1")),
        ApplyResult::Invalid { reason: InvalidReason::TokensExhausted }
    );
    assert!(restored.is_empty());
}

// ---------------------------------------------------------------------------
// Snapshots

fn sample_table() -> LockTable {
    let mut table = LockTable::new();
    for (k, o) in [("a", "o1"), ("b", "o2"), ("c", "o3"), ("d", "o1")] {
        granted(&mut table, k, o);
    }
    table.apply(Command::Release { key: key("b"), token: None, user: None });
    table
}

#[test]
fn snapshot_restores_an_equal_table() {
    let table = sample_table();
    let restored = LockTable::restore(&table.snapshot()).unwrap();
    assert_eq!(restored, table);
    assert_eq!(restored.snapshot(), table.snapshot());
    assert_eq!(LockTable::restore(&LockTable::new().snapshot()).unwrap(), LockTable::new());
}

#[test]
fn every_truncation_of_a_snapshot_is_refused() {
    let bytes = sample_table().snapshot();
    for len in 0..bytes.len() {
        assert!(LockTable::restore(&bytes[..len]).is_err(), "truncated to {len} bytes");
    }
    let mut longer = bytes.clone();
    longer.push(0);
    assert!(LockTable::restore(&longer).is_err());
}

#[test]
fn every_single_bit_flip_in_a_snapshot_is_refused() {
    let bytes = sample_table().snapshot();
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut corrupt = bytes.clone();
            corrupt[i] ^= 1 << bit;
            assert!(LockTable::restore(&corrupt).is_err(), "flip of bit {bit} in byte {i}");
        }
    }
}

/// Wraps a hand-made body in a valid header, as a buggy writer could have.
fn framed(body: &pb::TableSnapshot) -> Vec<u8> {
    let body = body.write_to_bytes().unwrap();
    let mut bytes = b"FLKT".to_vec();
    bytes.extend_from_slice(&crate::SNAPSHOT_VERSION.to_le_bytes());
    bytes.extend_from_slice(&[0, 0]);
    bytes.extend_from_slice(&(body.len() as u64).to_le_bytes());
    bytes.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
    bytes.extend_from_slice(&body);
    bytes
}

fn record(k: &str, t: u64) -> pb::LockRecord {
    pb::LockRecord {
        key: k.as_bytes().to_vec(),
        token: t,
        owner: b"o".to_vec(),
        lease_ms: 100,
        ..Default::default()
    }
}

#[test]
fn snapshots_with_valid_checksums_but_broken_contents_are_refused() {
    let body = |last_token, locks: Vec<pb::LockRecord>| pb::TableSnapshot {
        last_token,
        locks: locks.into(),
        ..Default::default()
    };
    assert!(LockTable::restore(&framed(&body(2, vec![record("a", 1), record("b", 2)]))).is_ok());

    let cases = [
        (body(2, vec![record("b", 1), record("a", 2)]), SnapshotError::KeysOutOfOrder { index: 1 }),
        (body(2, vec![record("a", 1), record("a", 2)]), SnapshotError::KeysOutOfOrder { index: 1 }),
        (
            body(2, vec![record("a", 2), record("b", 2)]),
            SnapshotError::DuplicateToken { index: 1, token: token(2) },
        ),
        (
            body(1, vec![record("a", 1), record("b", 2)]),
            SnapshotError::TokenPastLast { index: 1, token: token(2) },
        ),
        (body(0, vec![record("a", 1)]), SnapshotError::TokenPastLast { index: 0, token: token(1) }),
        (
            body(3, vec![record("a", 0)]),
            SnapshotError::InvalidRecord { index: 0, reason: InvalidReason::ZeroToken },
        ),
        (
            body(3, vec![record("", 1)]),
            SnapshotError::InvalidRecord { index: 0, reason: InvalidReason::EmptyKey },
        ),
        (
            body(3, vec![pb::LockRecord { lease_ms: 0, ..record("a", 1) }]),
            SnapshotError::InvalidRecord { index: 0, reason: InvalidReason::ZeroLease },
        ),
        (
            body(3, vec![pb::LockRecord { owner: Vec::new(), ..record("a", 1) }]),
            SnapshotError::InvalidRecord { index: 0, reason: InvalidReason::EmptyOwner },
        ),
    ];
    for (body, expected) in cases {
        assert_eq!(LockTable::restore(&framed(&body)), Err(expected));
    }
}

#[test]
fn a_bootstrap_raises_the_token_counter_to_its_floor_and_never_lowers_it() {
    let id = ClusterId::new([1; 16]);
    let floor = 1_796_313_449_000_000;
    let mut table = LockTable::new();
    table.apply(Command::Bootstrap { cluster_id: id, token_floor: floor, level: 1 });
    assert_eq!(table.last_token(), FencingToken::new(floor));
    assert_eq!(granted(&mut table, "a", "o1"), token(floor + 1));
    assert_eq!(LockTable::restore(&table.snapshot()).unwrap().last_token(), FencingToken::new(floor + 1));
    // A table that issued tokens past the floor (a cluster from before
    // cluster ids) keeps its counter.
    let mut upgraded = LockTable::new();
    for name in ["a", "b", "c"] {
        granted(&mut upgraded, name, "o1");
    }
    upgraded.apply(Command::Bootstrap { cluster_id: id, token_floor: 2, level: 1 });
    assert_eq!(upgraded.last_token(), Some(token(3)));
    assert_eq!(granted(&mut upgraded, "d", "o1"), token(4));
}

#[test]
fn commands_above_the_tables_level_apply_as_invalid_until_it_is_raised() {
    // A log as a cluster from before command levels has it: level 1.
    let mut table = LockTable::at_level(1);
    assert_eq!(granted(&mut table, "a", "o1"), token(1));
    let shared = Command::GrantShared {
        key: key("s"),
        lease_ms: lease(1_000),
        owner: owner("o2"),
        share: Share::Read,
    };
    let proclaim = Command::Proclaim {
        key: key("a"),
        token: token(1),
        value: Value::new(b"v".to_vec()).unwrap(),
        user: None,
    };
    let refused = ApplyResult::Invalid { reason: InvalidReason::LevelNotReached };
    // As a build that does not know them applies them: nothing changes,
    // and above all the token counter does not move.
    let before = table.clone();
    assert_eq!(table.apply(shared.clone()), refused);
    assert_eq!(table.apply(proclaim.clone()), refused);
    assert_eq!(table, before);
    // A Bootstrap founds at its level; a later one changes nothing.
    let mut founded = LockTable::at_level(1);
    founded.apply(Command::Bootstrap { cluster_id: ClusterId::new([1; 16]), token_floor: 0, level: 2 });
    assert_eq!(founded.level(), 2);
    let mut late = table.clone();
    late.apply(Command::Bootstrap { cluster_id: ClusterId::new([1; 16]), token_floor: 0, level: 1 });
    late.apply(Command::Bootstrap { cluster_id: ClusterId::new([2; 16]), token_floor: 0, level: 2 });
    assert_eq!(late.level(), 1);
    // RaiseLevel lets them in, and never lowers the level.
    assert_eq!(table.apply(Command::RaiseLevel { level: 2 }), ApplyResult::Noop);
    assert_eq!(table.apply(Command::RaiseLevel { level: 1 }), ApplyResult::Noop);
    assert_eq!(table.level(), 2);
    assert!(matches!(table.apply(shared), ApplyResult::Granted { token: t, .. } if t == token(2)));
    assert_eq!(table.apply(proclaim), ApplyResult::Proclaimed { token: token(1) });
    // The level is in the snapshot; level 1 is written as builds before
    // levels wrote it (not at all), and reads back as 1.
    assert_eq!(LockTable::restore(&table.snapshot()).unwrap().level(), 2);
    let old = LockTable::at_level(1);
    assert_eq!(LockTable::restore(&old.snapshot()).unwrap().level(), 1);
    let mut body = pb::TableSnapshot::default();
    assert_eq!(LockTable::restore(&framed(&body)).unwrap().level(), 1);
    body.level = 3;
    assert_eq!(LockTable::restore(&framed(&body)).unwrap().level(), 3);
    // A table for one program is at this build's level.
    assert_eq!(LockTable::new().level(), fencelock_types::LEVEL);
}

#[test]
fn the_first_cluster_id_stays_and_snapshots_keep_it() {
    let mut table = sample_table();
    assert_eq!(table.cluster_id(), None);
    let (first, second) = (ClusterId::new([1; 16]), ClusterId::new([2; 16]));
    let bootstrap = |cluster_id, token_floor| Command::Bootstrap { cluster_id, token_floor, level: 1 };
    assert_eq!(table.apply(bootstrap(first, 0)), ApplyResult::Noop);
    assert_eq!(table.apply(bootstrap(second, 1_000_000)), ApplyResult::Noop);
    assert_eq!(table.cluster_id(), Some(first));
    let restored = LockTable::restore(&table.snapshot()).unwrap();
    assert_eq!(restored, table);
    assert_eq!(restored.cluster_id(), Some(first));
    // A table without one restores without one.
    assert_eq!(LockTable::restore(&sample_table().snapshot()).unwrap().cluster_id(), None);
}

#[test]
fn a_table_for_restore_keeps_locks_and_counter_and_drops_cluster_id_and_members() {
    let mut table = sample_table();
    table.apply(Command::Bootstrap { cluster_id: ClusterId::new([7; 16]), token_floor: 500, level: 1 });
    let granted_after = granted(&mut table, "e", "o4");
    table.set_member(4, crate::MemberAddrs { peer_addr: "n4:7001".into(), client_addr: "n4:7101".into() });
    let seed = table.for_restore();
    assert_eq!(seed.cluster_id(), None);
    assert_eq!(seed.members().count(), 0);
    assert_eq!(seed.last_token(), Some(granted_after));
    let locks =
        |t: &LockTable| t.list(b"", usize::MAX).map(|(k, l)| (k.clone(), l.clone())).collect::<Vec<_>>();
    assert_eq!(locks(&seed), locks(&table));
    assert_eq!(seed.len(), 4);
    assert_eq!(seed.locks_of(b"o1"), table.locks_of(b"o1"));
    // It survives its own snapshot (what a restored node stores).
    let restored = LockTable::restore(&seed.snapshot()).unwrap();
    assert_eq!(restored, seed);
    // The original is untouched.
    assert_eq!(table.cluster_id(), Some(ClusterId::new([7; 16])));
    assert_eq!(table.members().count(), 1);
    // The new cluster's Bootstrap names it and raises the counter above
    // the saved one only if its floor is higher.
    let mut founded = seed.clone();
    founded.apply(Command::Bootstrap { cluster_id: ClusterId::new([8; 16]), token_floor: 1, level: 1 });
    assert_eq!(founded.last_token(), Some(granted_after));
    assert_eq!(founded.cluster_id(), Some(ClusterId::new([8; 16])));
    let mut floored = seed;
    floored.apply(Command::Bootstrap { cluster_id: ClusterId::new([9; 16]), token_floor: 10_000, level: 1 });
    assert_eq!(granted(&mut floored, "f", "o5").get(), 10_001);
}

#[test]
fn the_member_directory_travels_in_the_snapshot_and_bad_records_are_refused() {
    let mut table = sample_table();
    let addrs = |peer: &str, client: &str| MemberAddrs { peer_addr: peer.into(), client_addr: client.into() };
    let before = table.snapshot();
    table.set_member(4, addrs("node-4:7001", "node-4:7101"));
    table.set_member(2, addrs("10.0.0.2:7001", "10.0.0.2:7101"));
    table.set_member(4, addrs("node-4b:7001", "node-4b:7101"));
    let restored = LockTable::restore(&table.snapshot()).unwrap();
    assert_eq!(restored, table);
    let members: Vec<(u64, &MemberAddrs)> = restored.members().collect();
    assert_eq!(
        members,
        vec![(2, &addrs("10.0.0.2:7001", "10.0.0.2:7101")), (4, &addrs("node-4b:7001", "node-4b:7101"))]
    );
    table.remove_member(4);
    table.remove_member(2);
    // A table whose directory is empty again encodes as before it had one.
    assert_eq!(table.snapshot(), before);

    let record = |id, peer: &str, client: &str| pb::MemberRecord {
        id,
        peer_addr: peer.into(),
        client_addr: client.into(),
        ..Default::default()
    };
    let body =
        |members: Vec<pb::MemberRecord>| pb::TableSnapshot { members: members.into(), ..Default::default() };
    assert!(
        LockTable::restore(&framed(&body(vec![record(1, "a:1", "a:2"), record(2, "b:1", "b:2")]))).is_ok()
    );
    let long = "h".repeat(crate::MEMBER_ADDR_MAX + 1);
    for (members, index) in [
        (vec![record(0, "a:1", "a:2")], 0),
        (vec![record(2, "a:1", "a:2"), record(1, "b:1", "b:2")], 1),
        (vec![record(1, "a:1", "a:2"), record(1, "b:1", "b:2")], 1),
        (vec![record(1, "", "a:2")], 0),
        (vec![record(1, "a:1", &long)], 0),
    ] {
        let refused = LockTable::restore(&framed(&body(members)));
        assert!(
            matches!(refused, Err(SnapshotError::InvalidMember { index: at, .. }) if at == index),
            "{refused:?}"
        );
    }
}

#[test]
fn snapshot_header_errors_are_specific() {
    let bytes = sample_table().snapshot();
    let mut magic = bytes.clone();
    magic[0] = b'X';
    assert_eq!(LockTable::restore(&magic), Err(SnapshotError::BadMagic));
    let mut version = bytes.clone();
    version[4] = 9;
    assert_eq!(LockTable::restore(&version), Err(SnapshotError::UnsupportedVersion(9)));
    assert_eq!(LockTable::restore(&bytes[..3]), Err(SnapshotError::TooShort { len: 3 }));
    let mut body = bytes.clone();
    let last = body.len() - 1;
    body[last] ^= 0xff;
    assert_eq!(LockTable::restore(&body), Err(SnapshotError::Checksum));
}

// ---------------------------------------------------------------------------
// Properties over random histories

/// A model holder of a shared key: token, owner, lease, share.
type ModelHolder = (FencingToken, Owner, LeaseMs, Share, bool);

/// A deliberately naive model of the lock table: a vector scanned linearly.
#[derive(Default)]
struct Model {
    /// Key, token, owner, lease (the delay once held back), held back by
    /// lock-delay.
    locks: Vec<(Key, FencingToken, Owner, LeaseMs, bool)>,
    /// The value of each lock, by token.
    values: Vec<(FencingToken, Value)>,
    /// Read-write locks (permits 0) and semaphores: key, permits, and
    /// holders (token, owner, lease, share) in grant order.
    shared: Vec<(Key, u32, Vec<ModelHolder>)>,
    last_token: u64,
    cluster_id: Option<ClusterId>,
    /// The command level: GrantShared and Proclaim need 2.
    level: u32,
}

impl Model {
    /// The value the lock under `token` carries: the last one given it.
    fn value_of(&self, token: FencingToken) -> Value {
        self.values
            .iter()
            .rev()
            .find(|(t, _)| *t == token)
            .map(|(_, value)| value.clone())
            .unwrap_or_default()
    }

    fn position(&self, key: &Key) -> Option<usize> {
        self.locks.iter().position(|(k, ..)| k == key)
    }

    fn shared_position(&self, key: &Key) -> Option<usize> {
        self.shared.iter().position(|(k, ..)| k == key)
    }

    fn next_token(&mut self) -> Option<FencingToken> {
        self.last_token = self.last_token.checked_add(1)?;
        Some(token(self.last_token))
    }

    /// A shared key's command on holder `t`: its index among the holders.
    fn shared_holder(&self, at: usize, t: FencingToken) -> Option<usize> {
        self.shared[at].2.iter().position(|(held, ..)| *held == t)
    }

    fn lowest(&self, at: usize) -> FencingToken {
        self.shared[at].2.iter().map(|(t, ..)| *t).min().unwrap()
    }

    /// The lowest token of a holder not held back by lock-delay.
    fn lowest_live(&self, at: usize) -> Option<FencingToken> {
        self.shared[at].2.iter().filter(|h| !h.4).map(|(t, ..)| *t).min()
    }

    fn drop_holder(&mut self, at: usize, i: usize) -> FencingToken {
        let (t, ..) = self.shared[at].2.remove(i);
        if self.shared[at].2.is_empty() {
            self.shared.remove(at);
        }
        t
    }

    fn grant_shared(&mut self, key: Key, lease_ms: LeaseMs, owner: Owner, share: Share) -> ApplyResult {
        if let Some(i) = self.position(&key) {
            return ApplyResult::GrantRejected { holder_token: self.locks[i].1 };
        }
        let permits = match share {
            Share::Permit(n) => n,
            _ => 0,
        };
        let Some(at) = self.shared_position(&key) else {
            let Some(t) = self.next_token() else {
                return ApplyResult::Invalid { reason: InvalidReason::TokensExhausted };
            };
            self.shared.push((key, permits, vec![(t, owner, lease_ms, share, false)]));
            return ApplyResult::Granted { token: t, lease_ms, existing: false };
        };
        if self.shared[at].1 != permits {
            return ApplyResult::Mismatch { permits: self.shared[at].1 };
        }
        if let Some(i) = self.shared[at].2.iter().position(|(_, o, ..)| *o == owner) {
            let (t, _, held_lease, held_share, held_back) = self.shared[at].2[i].clone();
            if held_share != share || held_back {
                return ApplyResult::GrantRejected { holder_token: t };
            }
            let lease_ms = held_lease.max(lease_ms);
            self.shared[at].2[i].2 = lease_ms;
            return ApplyResult::Granted { token: t, lease_ms, existing: true };
        }
        let holders = &self.shared[at].2;
        let fits = match share {
            Share::Permit(n) => holders.len() < n as usize,
            Share::Read => holders.iter().all(|(.., s, _)| *s == Share::Read),
            Share::Write => false,
        };
        if !fits {
            return ApplyResult::GrantRejected { holder_token: self.lowest(at) };
        }
        let Some(t) = self.next_token() else {
            return ApplyResult::Invalid { reason: InvalidReason::TokensExhausted };
        };
        self.shared[at].2.push((t, owner, lease_ms, share, false));
        ApplyResult::Granted { token: t, lease_ms, existing: false }
    }

    /// Release, Renew, Expire or Proclaim of a shared key, or `None` when
    /// the key is not shared.
    fn shared_command(&mut self, command: &Command) -> Option<ApplyResult> {
        let key = command.key()?;
        let at = self.shared_position(key)?;
        let lowest = self.lowest_live(at);
        Some(match command.clone() {
            Command::Release { token: None, .. } => {
                let last = self.shared[at].2.iter().map(|(t, ..)| *t).max().unwrap();
                self.shared.remove(at);
                ApplyResult::Released { token: last }
            }
            Command::Release { token: Some(t), user, .. } => match self.shared_holder(at, t) {
                None => ApplyResult::NotFound { holder_token: lowest },
                Some(i) if self.shared[at].2[i].4 => ApplyResult::NotFound { holder_token: lowest },
                Some(i)
                    if user.as_ref().is_some_and(|user| !model_owned_by(&self.shared[at].2[i].1, user)) =>
                {
                    ApplyResult::Denied { token: t }
                }
                Some(i) => ApplyResult::Released { token: self.drop_holder(at, i) },
            },
            Command::Expire { token: t, delay, .. } => match (self.shared_holder(at, t), delay) {
                (None, _) => ApplyResult::Expired { existed: false },
                (Some(i), Some(delay_ms)) if !self.shared[at].2[i].4 => {
                    self.shared[at].2[i].2 = delay_ms;
                    self.shared[at].2[i].4 = true;
                    ApplyResult::Delayed { token: t, delay_ms }
                }
                (Some(_), Some(_)) => ApplyResult::Expired { existed: false },
                (Some(i), None) => {
                    self.drop_holder(at, i);
                    ApplyResult::Expired { existed: true }
                }
            },
            Command::Renew { token: t, lease_ms, user, .. } => match self.shared_holder(at, t) {
                None => ApplyResult::NotFound { holder_token: lowest },
                Some(i) if self.shared[at].2[i].4 => ApplyResult::NotFound { holder_token: lowest },
                Some(i) => match user {
                    None => {
                        self.shared[at].2[i].2 = lease_ms;
                        ApplyResult::Renewed { token: t, lease_ms }
                    }
                    Some(user) if model_owned_by(&self.shared[at].2[i].1, &user) => {
                        let lease_ms = self.shared[at].2[i].2.max(lease_ms);
                        self.shared[at].2[i].2 = lease_ms;
                        ApplyResult::Renewed { token: t, lease_ms }
                    }
                    Some(_) => ApplyResult::Denied { token: t },
                },
            },
            Command::Proclaim { .. } => ApplyResult::NotFound { holder_token: lowest },
            _ => return None,
        })
    }

    fn apply(&mut self, command: &Command) -> ApplyResult {
        if matches!(command, Command::GrantShared { .. } | Command::Proclaim { .. }) && self.level < 2 {
            return ApplyResult::Invalid { reason: InvalidReason::LevelNotReached };
        }
        if !matches!(command, Command::GrantShared { .. } | Command::Grant { .. }) {
            if let Some(result) = self.shared_command(command) {
                return result;
            }
        }
        match command.clone() {
            Command::GrantShared { key, lease_ms, owner, share } => {
                self.grant_shared(key, lease_ms, owner, share)
            }
            Command::Grant { key, .. } if self.shared_position(&key).is_some() => {
                let at = self.shared_position(&key).unwrap();
                ApplyResult::GrantRejected { holder_token: self.lowest(at) }
            }
            Command::Grant { key, lease_ms, owner, value } => match self.position(&key) {
                Some(i) if self.locks[i].2 == owner && !self.locks[i].4 => {
                    self.locks[i].3 = self.locks[i].3.max(lease_ms);
                    ApplyResult::Granted { token: self.locks[i].1, lease_ms: self.locks[i].3, existing: true }
                }
                Some(i) => ApplyResult::GrantRejected { holder_token: self.locks[i].1 },
                None => {
                    let Some(next) = self.last_token.checked_add(1) else {
                        return ApplyResult::Invalid { reason: InvalidReason::TokensExhausted };
                    };
                    self.last_token = next;
                    let t = token(self.last_token);
                    self.locks.push((key, t, owner, lease_ms, false));
                    self.values.push((t, value));
                    ApplyResult::Granted { token: t, lease_ms, existing: false }
                }
            },
            Command::Release { key, token, user } => match self.position(&key) {
                Some(i) if self.locks[i].4 && token.is_some() => ApplyResult::NotFound { holder_token: None },
                Some(i) if token.is_none() || token == Some(self.locks[i].1) => {
                    if user.is_some_and(|user| !model_owned_by(&self.locks[i].2, &user)) {
                        return ApplyResult::Denied { token: self.locks[i].1 };
                    }
                    ApplyResult::Released { token: self.locks.remove(i).1 }
                }
                other => ApplyResult::NotFound { holder_token: other.map(|i| self.locks[i].1) },
            },
            Command::Expire { key, token, delay } => match self.position(&key) {
                Some(i) if self.locks[i].1 == token => match (self.locks[i].4, delay) {
                    (false, Some(delay_ms)) => {
                        self.locks[i].3 = delay_ms;
                        self.locks[i].4 = true;
                        ApplyResult::Delayed { token, delay_ms }
                    }
                    (true, Some(_)) => ApplyResult::Expired { existed: false },
                    (_, None) => {
                        self.locks.remove(i);
                        ApplyResult::Expired { existed: true }
                    }
                },
                _ => ApplyResult::Expired { existed: false },
            },
            Command::Renew { key, token, lease_ms, user } => match self.position(&key) {
                Some(i) if self.locks[i].4 => ApplyResult::NotFound { holder_token: None },
                Some(i) if self.locks[i].1 == token => match user {
                    None => {
                        self.locks[i].3 = lease_ms;
                        ApplyResult::Renewed { token, lease_ms }
                    }
                    Some(user) if model_owned_by(&self.locks[i].2, &user) => {
                        if lease_ms > self.locks[i].3 {
                            self.locks[i].3 = lease_ms;
                        }
                        ApplyResult::Renewed { token, lease_ms: self.locks[i].3 }
                    }
                    Some(_) => ApplyResult::Denied { token },
                },
                other => ApplyResult::NotFound { holder_token: other.map(|i| self.locks[i].1) },
            },
            Command::Proclaim { key, token, value, user } => match self.position(&key) {
                Some(i) if self.locks[i].4 => ApplyResult::NotFound { holder_token: None },
                Some(i) if self.locks[i].1 == token => {
                    if user.is_some_and(|user| !model_owned_by(&self.locks[i].2, &user)) {
                        return ApplyResult::Denied { token };
                    }
                    self.values.push((token, value));
                    ApplyResult::Proclaimed { token }
                }
                other => ApplyResult::NotFound { holder_token: other.map(|i| self.locks[i].1) },
            },
            Command::Noop => ApplyResult::Noop,
            Command::Bootstrap { cluster_id, token_floor, level } => {
                if self.cluster_id.is_none() {
                    self.cluster_id = Some(cluster_id);
                    self.last_token = self.last_token.max(token_floor);
                    self.level = self.level.max(level);
                }
                ApplyResult::Noop
            }
            Command::RaiseLevel { level } => {
                self.level = self.level.max(level);
                ApplyResult::Noop
            }
        }
    }
}

/// The model's reading of "this owner is that user's": the owner up to its
/// first `/` is the user.
fn model_owned_by(owner: &Owner, user: &Owner) -> bool {
    let owner = owner.as_bytes();
    let name = owner.split(|byte| *byte == b'/').next().unwrap_or(owner);
    name == user.as_bytes()
}

fn arb_user() -> impl Strategy<Value = Option<Owner>> {
    prop::option::weighted(0.5, prop::sample::select(vec!["o1", "o2"]).prop_map(owner))
}

fn arb_key() -> impl Strategy<Value = Key> {
    prop::sample::select(vec!["a", "b", "c", "ab"]).prop_map(key)
}

fn arb_owner() -> impl Strategy<Value = Owner> {
    prop::sample::select(vec!["o1", "o2", "o3", "o1/a", "o2/a", "o12"]).prop_map(owner)
}

fn arb_share() -> impl Strategy<Value = Share> {
    prop::sample::select(vec![Share::Read, Share::Read, Share::Write, Share::Permit(2), Share::Permit(3)])
}

fn arb_value() -> impl Strategy<Value = Value> {
    prop::sample::select(vec!["", "10.0.0.1:80", "v2"])
        .prop_map(|v| Value::new(v.as_bytes().to_vec()).unwrap())
}

fn arb_lease() -> impl Strategy<Value = LeaseMs> {
    prop::sample::select(vec![1u64, 500, 30_000]).prop_map(lease)
}

/// Tokens from a small range, so that commands hit current, stale and future
/// tokens alike.
fn arb_token() -> impl Strategy<Value = FencingToken> {
    (1u64..=12).prop_map(token)
}

fn arb_command() -> impl Strategy<Value = Command> {
    prop_oneof![
        4 => (arb_key(), arb_lease(), arb_owner(), arb_value())
            .prop_map(|(key, lease_ms, owner, value)| Command::Grant { key, lease_ms, owner, value }),
        1 => (arb_key(), arb_token(), arb_value(), arb_user())
            .prop_map(|(key, token, value, user)| Command::Proclaim { key, token, value, user }),
        2 => (arb_key(), prop::option::weighted(0.8, arb_token()), arb_user()).prop_map(|(key, token, user)| Command::Release { key, token, user }),
        2 => (arb_key(), arb_token(), prop::option::weighted(0.4, arb_lease()))
            .prop_map(|(key, token, delay)| Command::Expire { key, token, delay }),
        2 => (arb_key(), arb_token(), arb_lease(), arb_user()).prop_map(|(key, token, lease_ms, user)| Command::Renew { key, token, lease_ms, user }),
        4 => (arb_key(), arb_lease(), arb_owner(), arb_share())
            .prop_map(|(key, lease_ms, owner, share)| Command::GrantShared { key, lease_ms, owner, share }),
        1 => Just(Command::Noop),
        1 => (1u8..=3, prop::sample::select(vec![0u64, 2, 5, 1_000, u64::MAX - 1]), 1u32..=3)
            .prop_map(|(n, token_floor, level)| Command::Bootstrap { cluster_id: ClusterId::new([n; 16]), token_floor, level }),
        1 => (1u32..=3).prop_map(|level| Command::RaiseLevel { level }),
    ]
}

fn arb_history() -> impl Strategy<Value = Vec<Command>> {
    prop::collection::vec(arb_command(), 0..200)
}

/// A history cut into log entries of 1 to 4 commands, with some undecodable
/// entries mixed in.
fn arb_entries() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let entry = prop_oneof![
        8 => prop::collection::vec(arb_command(), 1..4).prop_map(|c| encode_batch(&c)),
        1 => prop::collection::vec(any::<u8>(), 0..12),
    ];
    prop::collection::vec(entry, 0..80)
}

fn token_of(result: &ApplyResult) -> Option<FencingToken> {
    match result {
        ApplyResult::Granted { token, existing: false, .. } => Some(*token),
        _ => None,
    }
}

/// Values of every varint length from 1 to `bits_max` bits (a uniform
/// draw would almost never be short).
fn arb_varint(bits_max: u32) -> impl Strategy<Value = u64> {
    (1..=bits_max).prop_flat_map(|bits| {
        let low = 1u64 << (bits - 1);
        let high = if bits == 64 { u64::MAX } else { (1u64 << bits) - 1 };
        low..=high
    })
}

/// Valid snapshot bodies with any key, owner, token and lease values, of
/// every varint length.
fn arb_snapshot_body() -> impl Strategy<Value = pb::TableSnapshot> {
    let lease = arb_varint(31).prop_filter("a valid lease", |ms| *ms <= fencelock_types::LEASE_MS_MAX);
    let records = prop::collection::btree_map(
        prop::collection::vec(any::<u8>(), 1..200),
        (
            prop::collection::vec(any::<u8>(), 1..150),
            lease,
            any::<bool>(),
            prop::collection::vec(any::<u8>(), 0..40),
        ),
        0..20,
    );
    let tokens = prop::collection::btree_set(arb_varint(63), 0..=20);
    let cluster_id = prop::option::of(any::<[u8; 16]>());
    let members = prop::collection::btree_map(
        arb_varint(64),
        ("[a-z0-9.-]{1,40}:[0-9]{1,5}", "[a-z0-9.]{1,40}:[0-9]{1,5}"),
        0..6,
    );
    (records, tokens, arb_varint(20), cluster_id, members).prop_map(
        |(records, tokens, extra, cluster_id, members)| {
            let last_token = tokens.iter().max().map_or(extra, |max| max + extra);
            let locks = records
                .into_iter()
                .zip(tokens.into_iter().rev())
                .map(|((key, (owner, lease_ms, delayed, value)), token)| pb::LockRecord {
                    key,
                    token,
                    owner,
                    lease_ms,
                    delayed,
                    value,
                    ..Default::default()
                })
                .collect();
            let cluster_id = cluster_id.map_or_else(Vec::new, |id| id.to_vec());
            let members = members
                .into_iter()
                .map(|(id, (peer_addr, client_addr))| pb::MemberRecord {
                    id,
                    peer_addr,
                    client_addr,
                    ..Default::default()
                })
                .collect();
            pb::TableSnapshot { last_token, locks, cluster_id, members, ..Default::default() }
        },
    )
}

proptest! {
    #[test]
    fn snapshots_are_byte_for_byte_what_the_protobuf_library_writes(body in arb_snapshot_body()) {
        let reference = framed(&body);
        let table = LockTable::restore(&reference).unwrap();
        prop_assert_eq!(table.snapshot(), reference);
    }

    #[test]
    fn the_table_behaves_like_the_model(history in arb_history(), level in 1u32..=2) {
        // Level 1: a log as a cluster from before levels has it, where
        // shared keys and proclaims wait for a Bootstrap or RaiseLevel.
        let mut table = LockTable::at_level(level);
        let mut model = Model { level, ..Model::default() };
        for command in history {
            let expected = model.apply(&command);
            prop_assert_eq!(table.apply(command), expected);
        }
        prop_assert_eq!(table.level(), model.level);
        let mut model_locks: Vec<_> =
            model.locks.iter().map(|(k, t, ..)| (k.clone(), *t, model.value_of(*t))).collect();
        model_locks.sort();
        let table_locks: Vec<_> =
            table.list(b"", usize::MAX).map(|(k, l)| (k.clone(), l.token, l.value.clone())).collect();
        prop_assert_eq!(table_locks, model_locks);
        let mut model_shared: Vec<_> = model
            .shared
            .iter()
            .map(|(k, permits, holders)| {
                let mut holders: Vec<_> =
                    holders.iter().map(|(t, o, l, s, d)| (*t, o.clone(), *l, *s, *d)).collect();
                holders.sort_by_key(|(t, ..)| *t);
                (k.clone(), *permits, holders)
            })
            .collect();
        model_shared.sort_by(|a, b| a.0.cmp(&b.0));
        let table_shared: Vec<_> = table
            .list_shared(b"", usize::MAX)
            .map(|(k, shared)| {
                let holders: Vec<_> =
                    shared.holders.iter().map(|(t, h)| (*t, h.owner.clone(), h.lease_ms, h.share, h.delayed)).collect();
                (k.clone(), shared.permits, holders)
            })
            .collect();
        prop_assert_eq!(table_shared, model_shared);
        // The invariants of each kind hold in every table reached.
        for (_, shared) in table.list_shared(b"", usize::MAX) {
            prop_assert!(!shared.holders.is_empty());
            if shared.permits > 0 {
                prop_assert!(shared.holders.len() <= shared.permits as usize);
            } else {
                let writers = shared.holders.values().filter(|h| h.share == Share::Write).count();
                prop_assert!(writers == 0 || shared.holders.len() == 1, "a writer beside other holders");
            }
        }
        prop_assert_eq!(table.len(), model.locks.len() + model.shared.iter().map(|(_, _, h)| h.len()).sum::<usize>());
        prop_assert_eq!(table.last_token().map_or(0, FencingToken::get), model.last_token);
        prop_assert_eq!(table.cluster_id(), model.cluster_id);
        // Quotas count locks per identity: the owner before its first `/`.
        for identity in ["o1", "o2", "o3", "o12", "a", ""] {
            let held = model.locks.iter().filter(|(_, _, owner, _, delayed)| {
                let owner = owner.as_bytes();
                if *delayed {
                    return false;
                }
                owner.split(|byte| *byte == b'/').next() == Some(identity.as_bytes())
            });
            let shared_held = model
                .shared
                .iter()
                .flat_map(|(_, _, holders)| holders)
                .filter(|holder| !holder.4)
                .filter(|(_, owner, ..)| owner.as_bytes().split(|byte| *byte == b'/').next() == Some(identity.as_bytes()))
                .count();
            prop_assert_eq!(table.locks_of(identity.as_bytes()), held.count() + shared_held, "identity {}", identity);
        }
        // And so does a table restored from its snapshot.
        let restored = LockTable::restore(&table.snapshot()).unwrap();
        prop_assert_eq!(restored.locks_of(b"o1"), table.locks_of(b"o1"));
        prop_assert_eq!(restored, table);
    }

    #[test]
    fn equal_histories_give_equal_results_and_snapshot_bytes(entries in arb_entries()) {
        let mut one = LockTable::new();
        let mut two = LockTable::new();
        for entry in &entries {
            prop_assert_eq!(one.apply_entry(entry), two.apply_entry(entry));
            prop_assert_eq!(one.snapshot(), two.snapshot());
        }
    }

    #[test]
    fn every_new_token_is_greater_than_all_before_it(history in arb_history()) {
        let mut table = LockTable::new();
        let mut issued: Vec<FencingToken> = Vec::new();
        for command in history {
            let result = table.apply(command);
            if let Some(token) = token_of(&result) {
                prop_assert!(issued.iter().all(|earlier| *earlier < token), "{:?} after {:?}", token, issued);
                issued.push(token);
            }
            // Whatever the command, every holder's token was issued.
            for (_, lock) in table.list(b"", usize::MAX) {
                prop_assert!(issued.contains(&lock.token));
            }
        }
    }

    #[test]
    fn snapshot_restore_then_continue_equals_continuing(
        before in arb_history(),
        after in arb_history(),
    ) {
        let mut straight = LockTable::new();
        for command in before.clone() {
            straight.apply(command);
        }
        let mut restored = LockTable::restore(&straight.snapshot()).unwrap();
        prop_assert_eq!(&restored, &straight);
        for command in after {
            prop_assert_eq!(restored.apply(command.clone()), straight.apply(command));
        }
        prop_assert_eq!(restored.snapshot(), straight.snapshot());
    }

    #[test]
    fn stale_tokens_never_change_the_holder(history in arb_history(), k in arb_key(), lease_ms in arb_lease()) {
        let mut table = LockTable::new();
        for command in history {
            table.apply(command);
        }
        let Some(holder) = table.holder(k.as_bytes()).cloned() else { return Ok(()) };
        // The oldest and the newest stale tokens (a Bootstrap's floor can
        // put the holder's far above 1).
        let stale_tokens = (1..holder.token.get()).take(16).chain((1..holder.token.get()).rev().take(16));
        for stale in stale_tokens {
            let stale = token(stale);
            for command in [
                Command::Expire { key: k.clone(), token: stale, delay: None },
                Command::Expire { key: k.clone(), token: stale, delay: Some(lease_ms) },
                Command::Release { key: k.clone(), token: Some(stale), user: None },
                Command::Renew { key: k.clone(), token: stale, lease_ms, user: None },
            ] {
                let before = table.snapshot();
                table.apply(command);
                prop_assert_eq!(table.snapshot(), before);
            }
        }
    }

    #[test]
    fn applying_an_expire_twice_equals_applying_it_once(history in arb_history(), k in arb_key(), t in arb_token()) {
        let mut once = LockTable::new();
        for command in history {
            once.apply(command);
        }
        let mut twice = once.clone();
        let expire = Command::Expire { key: k, token: t, delay: None };
        once.apply(expire.clone());
        twice.apply(expire.clone());
        prop_assert_eq!(twice.apply(expire), ApplyResult::Expired { existed: false });
        prop_assert_eq!(once.snapshot(), twice.snapshot());
    }

    #[test]
    fn random_snapshot_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..128)) {
        let _ = LockTable::restore(&bytes);
    }
}

fn holder_record(token: u64, owner: &str, share: pb::Share) -> pb::HolderRecord {
    pb::HolderRecord { token, owner: owner.as_bytes().to_vec(), lease_ms: 1_000, share, ..Default::default() }
}

fn shared_record(key: &str, permits: u32, holders: Vec<pb::HolderRecord>) -> pb::SharedRecord {
    pb::SharedRecord { key: key.as_bytes().to_vec(), permits, holders: holders.into(), ..Default::default() }
}

#[test]
fn read_write_locks_and_semaphores_travel_in_snapshots_and_bad_ones_are_refused() {
    let mut table = LockTable::new();
    let share = |k: &str, o: &str, share| Command::GrantShared {
        key: key(k),
        lease_ms: lease(1000),
        owner: owner(o),
        share,
    };
    assert!(matches!(table.apply(share("rw", "o1", Share::Read)), ApplyResult::Granted { .. }));
    assert!(matches!(table.apply(share("rw", "o2", Share::Read)), ApplyResult::Granted { .. }));
    assert!(matches!(table.apply(share("rw", "o3", Share::Write)), ApplyResult::GrantRejected { .. }));
    assert!(matches!(table.apply(share("sem", "o1", Share::Permit(2))), ApplyResult::Granted { .. }));
    assert_eq!(table.apply(share("sem", "o2", Share::Permit(3))), ApplyResult::Mismatch { permits: 2 });
    assert_eq!(table.apply(share("rw", "o4", Share::Permit(3))), ApplyResult::Mismatch { permits: 0 });
    granted(&mut table, "plain", "o1");
    assert_eq!(table.len(), 4);
    let restored = LockTable::restore(&table.snapshot()).unwrap();
    assert_eq!(restored, table);
    assert_eq!(restored.locks_of(b"o1"), 3);

    let bad = |shared: Vec<pb::SharedRecord>, locks: Vec<pb::LockRecord>| {
        let body = pb::TableSnapshot {
            last_token: 9,
            locks: locks.into(),
            shared: shared.into(),
            ..Default::default()
        };
        LockTable::restore(&framed(&body))
    };
    let read = pb::Share::READ;
    let write = pb::Share::WRITE;
    let permit = pb::Share::PERMIT;
    assert!(bad(
        vec![shared_record("k", 0, vec![holder_record(1, "a", read), holder_record(2, "b", read)])],
        vec![]
    )
    .is_ok());
    let refused = [
        // A writer beside a reader.
        bad(
            vec![shared_record("k", 0, vec![holder_record(1, "a", read), holder_record(2, "b", write)])],
            vec![],
        ),
        // More holders than permits.
        bad(
            vec![shared_record("k", 1, vec![holder_record(1, "a", permit), holder_record(2, "b", permit)])],
            vec![],
        ),
        // A permit in a read-write lock.
        bad(vec![shared_record("k", 0, vec![holder_record(1, "a", permit)])], vec![]),
        // No holders.
        bad(vec![shared_record("k", 0, vec![])], vec![]),
        // One owner twice.
        bad(
            vec![shared_record("k", 2, vec![holder_record(1, "a", permit), holder_record(2, "a", permit)])],
            vec![],
        ),
        // A token also a plain lock's, and a key that is both.
        bad(vec![shared_record("k", 0, vec![holder_record(1, "a", read)])], vec![record("j", 1)]),
        bad(vec![shared_record("k", 0, vec![holder_record(2, "a", read)])], vec![record("k", 1)]),
        // Past the last token.
        bad(vec![shared_record("k", 0, vec![holder_record(10, "a", read)])], vec![]),
        // Out of key order.
        bad(
            vec![
                shared_record("m", 0, vec![holder_record(1, "a", read)]),
                shared_record("k", 0, vec![holder_record(2, "a", read)]),
            ],
            vec![],
        ),
    ];
    for (i, result) in refused.into_iter().enumerate() {
        assert!(result.is_err(), "bad record {i} was restored");
    }
}

#[test]
fn a_force_release_frees_every_holder_and_each_holder_renews_and_expires_alone() {
    let mut table = LockTable::new();
    let permit = |o: &str| Command::GrantShared {
        key: key("s"),
        lease_ms: lease(1000),
        owner: owner(o),
        share: Share::Permit(3),
    };
    let tokens: Vec<FencingToken> = ["o1", "o2", "o3"]
        .iter()
        .map(|o| match table.apply(permit(o)) {
            ApplyResult::Granted { token, existing: false, .. } => token,
            other => panic!("{other:?}"),
        })
        .collect();
    assert!(
        matches!(table.apply(permit("o4")), ApplyResult::GrantRejected { holder_token } if holder_token == tokens[0])
    );
    // A retry by a holder gets its own token back.
    assert!(
        matches!(table.apply(permit("o2")), ApplyResult::Granted { token, existing: true, .. } if token == tokens[1])
    );
    assert_eq!(
        table.apply(Command::Renew { key: key("s"), token: tokens[1], lease_ms: lease(5000), user: None }),
        ApplyResult::Renewed { token: tokens[1], lease_ms: lease(5000) }
    );
    // Lock-delay holds an expired permit back: it holds nothing, renews
    // and releases nothing, counts for no one, but its place stays taken
    // (its holder may still be at work), for it as for anyone, until an
    // Expire without a delay.
    let before = table.locks_of(b"o1");
    assert_eq!(
        table.apply(Command::Expire { key: key("s"), token: tokens[0], delay: Some(lease(500)) }),
        ApplyResult::Delayed { token: tokens[0], delay_ms: lease(500) }
    );
    assert!(table.holds(b"s", tokens[1]) && !table.holds(b"s", tokens[0]));
    assert_eq!(table.locks_of(b"o1"), before - 1);
    let first_live = Some(tokens[1]);
    assert_eq!(
        table.apply(Command::Renew { key: key("s"), token: tokens[0], lease_ms: lease(5000), user: None }),
        ApplyResult::NotFound { holder_token: first_live }
    );
    assert_eq!(
        table.apply(Command::Release { key: key("s"), token: Some(tokens[0]), user: None }),
        ApplyResult::NotFound { holder_token: first_live }
    );
    assert!(matches!(table.apply(permit("o4")), ApplyResult::GrantRejected { .. }));
    assert!(matches!(table.apply(permit("o1")), ApplyResult::GrantRejected { .. }));
    assert_eq!(LockTable::restore(&table.snapshot()).unwrap(), table);
    // A repeat changes nothing; the Expire without a delay frees the place.
    assert_eq!(
        table.apply(Command::Expire { key: key("s"), token: tokens[0], delay: Some(lease(500)) }),
        ApplyResult::Expired { existed: false }
    );
    assert_eq!(
        table.apply(Command::Expire { key: key("s"), token: tokens[0], delay: None }),
        ApplyResult::Expired { existed: true }
    );
    assert_eq!(table.locks_of(b"o1"), before - 1);
    assert!(matches!(table.apply(permit("o4")), ApplyResult::Granted { existing: false, .. }));
    assert_eq!(
        table.apply(Command::Release { key: key("s"), token: None, user: None }),
        ApplyResult::Released { token: table.last_token().unwrap() }
    );
    assert!(table.shared(b"s").is_none() && table.is_empty());
    assert_eq!(table.locks_of(b"o2"), 0);
    // The key is free for any kind now.
    assert!(matches!(table.apply(grant("s", "o9")), ApplyResult::Granted { .. }));
}
