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
    Command::Grant {
        session: None,
        key: key(k),
        lease_ms: lease(1000),
        owner: owner(o),
        value: Value::none(),
    }
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
        session: None,
        key: key("a"),
        lease_ms: lease(5000),
        owner: owner("o1"),
        value: Value::none(),
    });
    assert_eq!(retry, ApplyResult::Granted { token: first, lease_ms: lease(5000), existing: true });
    assert_eq!(table.holder(b"a").unwrap().lease_ms, lease(5000));
    // A stale retry with a shorter lease keeps the longer one.
    let stale = table.apply(Command::Grant {
        session: None,
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
        session: None,
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
        session: None,
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

/// A model holder of a shared key: token, owner, lease, share, held back.
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
    /// The command level: GrantShared and Proclaim need 2, sessions 3.
    level: u32,
    /// The open sessions: id, owner, TTL, in opening order.
    sessions: Vec<(FencingToken, Owner, LeaseMs)>,
    /// Which holder is under which session: the holder's key and token, the
    /// session. A holder leaves it when it goes or is held back.
    under: Vec<(Key, FencingToken, FencingToken)>,
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
        self.leave(t);
        t
    }

    /// The session holder `t` is under, if any.
    fn session_of(&self, t: FencingToken) -> Option<FencingToken> {
        self.under.iter().find(|(_, held, _)| *held == t).map(|(.., session)| *session)
    }

    /// Holder `t` leaves its session, if it is under one (it went, or was
    /// held back).
    fn leave(&mut self, t: FencingToken) {
        self.under.retain(|(_, held, _)| *held != t);
    }

    /// The open session `session`: its owner and TTL.
    fn open(&self, session: FencingToken) -> Option<(Owner, LeaseMs)> {
        self.sessions.iter().find(|(id, ..)| *id == session).map(|(_, owner, ttl)| (owner.clone(), *ttl))
    }

    /// The lease a Grant of `owner` naming `session` gets: its own without
    /// one, the session's TTL under an open session of the same owner,
    /// else the answer.
    fn session_lease(
        &self,
        session: Option<FencingToken>,
        owner: &Owner,
        lease_ms: LeaseMs,
    ) -> Result<LeaseMs, ApplyResult> {
        let Some(session) = session else { return Ok(lease_ms) };
        match self.open(session) {
            None => Err(ApplyResult::NoSession { session }),
            Some((session_owner, _)) if session_owner != *owner => {
                Err(ApplyResult::Denied { token: session })
            }
            Some((_, ttl)) => Ok(ttl),
        }
    }

    /// The answer to a RenewSession or CloseSession with `user`: `Ok` when
    /// it acts, with the session's TTL.
    fn owned(&self, session: FencingToken, user: Option<&Owner>) -> Result<LeaseMs, ApplyResult> {
        match self.open(session) {
            None => Err(ApplyResult::NoSession { session }),
            Some((owner, _)) if user.is_some_and(|user| !model_owned_by(&owner, user)) => {
                Err(ApplyResult::Denied { token: session })
            }
            Some((_, ttl)) => Ok(ttl),
        }
    }

    /// Ends `session`: each holder under it expires as an Expire of its
    /// token would, with the delay of the longest prefix of `delays` its key
    /// starts with.
    fn end_session(&mut self, session: FencingToken, delays: &[(Vec<u8>, LeaseMs)]) {
        self.sessions.retain(|(id, ..)| *id != session);
        let held: Vec<(Key, FencingToken)> = self
            .under
            .iter()
            .filter(|(.., under)| *under == session)
            .map(|(key, t, _)| (key.clone(), *t))
            .collect();
        for (key, t) in held {
            let mut delay: Option<(usize, LeaseMs)> = None;
            for (prefix, delay_ms) in delays {
                let longer = delay.is_none_or(|(len, _)| prefix.len() > len);
                if key.as_bytes().starts_with(prefix) && longer {
                    delay = Some((prefix.len(), *delay_ms));
                }
            }
            let expire = Command::Expire { key, token: t, delay: delay.map(|(_, delay_ms)| delay_ms) };
            self.apply(&expire);
        }
    }

    fn grant_shared(
        &mut self,
        key: Key,
        lease_ms: LeaseMs,
        owner: Owner,
        share: Share,
        session: Option<FencingToken>,
    ) -> ApplyResult {
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
            if let Some(session) = session {
                self.under.push((key.clone(), t, session));
            }
            self.shared.push((key, permits, vec![(t, owner, lease_ms, share, false)]));
            return ApplyResult::Granted { token: t, lease_ms, existing: false };
        };
        if self.shared[at].1 != permits {
            return ApplyResult::Mismatch { permits: self.shared[at].1 };
        }
        if let Some(i) = self.shared[at].2.iter().position(|(_, o, ..)| *o == owner) {
            let (t, _, held_lease, held_share, held_back) = self.shared[at].2[i].clone();
            if held_share != share || held_back || self.session_of(t) != session {
                return ApplyResult::GrantRejected { holder_token: t };
            }
            // Under a session, the holder keeps the session's lease.
            let lease_ms = if self.session_of(t).is_some() { held_lease } else { held_lease.max(lease_ms) };
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
        if let Some(session) = session {
            self.under.push((key, t, session));
        }
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
                let (_, _, holders) = self.shared.remove(at);
                for (t, ..) in holders {
                    self.leave(t);
                }
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
                    self.leave(t);
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
                    Some(user) if !model_owned_by(&self.shared[at].2[i].1, &user) => {
                        ApplyResult::Denied { token: t }
                    }
                    // Renews the session: the holder's lease is the session's.
                    _ if self.session_of(t).is_some() => {
                        ApplyResult::Renewed { token: t, lease_ms: self.shared[at].2[i].2 }
                    }
                    None => {
                        self.shared[at].2[i].2 = lease_ms;
                        ApplyResult::Renewed { token: t, lease_ms }
                    }
                    Some(_) => {
                        let lease_ms = self.shared[at].2[i].2.max(lease_ms);
                        self.shared[at].2[i].2 = lease_ms;
                        ApplyResult::Renewed { token: t, lease_ms }
                    }
                },
            },
            // A shared holder carries no value: its own proclaim is
            // invalid, whoever asks; any other token does not hold the key.
            Command::Proclaim { token: t, .. } => match self.shared_holder(at, t) {
                Some(i) if !self.shared[at].2[i].4 => {
                    ApplyResult::Invalid { reason: InvalidReason::SharedHolderHasNoValue }
                }
                _ => ApplyResult::NotFound { holder_token: lowest },
            },
            _ => return None,
        })
    }

    /// The level a command needs, as the protocol says.
    fn level_of(command: &Command) -> u32 {
        match command {
            Command::OpenSession { .. }
            | Command::RenewSession { .. }
            | Command::CloseSession { .. }
            | Command::ExpireSession { .. } => 3,
            Command::Grant { session, .. } | Command::GrantShared { session, .. } if session.is_some() => 3,
            Command::GrantShared { .. } | Command::Proclaim { .. } => 2,
            _ => 1,
        }
    }

    fn apply(&mut self, command: &Command) -> ApplyResult {
        if Model::level_of(command) > self.level {
            return ApplyResult::Invalid { reason: InvalidReason::LevelNotReached };
        }
        // A grant under a session that is not open, or not its owner's,
        // is turned away before anything else.
        if let Command::Grant { session, owner, .. } | Command::GrantShared { session, owner, .. } = command {
            if let Err(refused) = self.session_lease(*session, owner, lease(1)) {
                return refused;
            }
        }
        if !matches!(command, Command::GrantShared { .. } | Command::Grant { .. }) {
            if let Some(result) = self.shared_command(command) {
                return result;
            }
        }
        match command.clone() {
            Command::GrantShared { key, lease_ms, owner, share, session } => {
                let lease_ms = self.session_lease(session, &owner, lease_ms).unwrap();
                self.grant_shared(key, lease_ms, owner, share, session)
            }
            Command::Grant { key, .. } if self.shared_position(&key).is_some() => {
                let at = self.shared_position(&key).unwrap();
                ApplyResult::GrantRejected { holder_token: self.lowest(at) }
            }
            Command::Grant { key, lease_ms, owner, value, session } => {
                let lease_ms = self.session_lease(session, &owner, lease_ms).unwrap();
                match self.position(&key) {
                    Some(i)
                        if self.locks[i].2 == owner
                            && !self.locks[i].4
                            && self.session_of(self.locks[i].1) == session =>
                    {
                        // Under a session, the lock keeps the session's lease.
                        if self.session_of(self.locks[i].1).is_none() {
                            self.locks[i].3 = self.locks[i].3.max(lease_ms);
                        }
                        ApplyResult::Granted {
                            token: self.locks[i].1,
                            lease_ms: self.locks[i].3,
                            existing: true,
                        }
                    }
                    Some(i) => ApplyResult::GrantRejected { holder_token: self.locks[i].1 },
                    None => {
                        let Some(next) = self.last_token.checked_add(1) else {
                            return ApplyResult::Invalid { reason: InvalidReason::TokensExhausted };
                        };
                        self.last_token = next;
                        let t = token(self.last_token);
                        if let Some(session) = session {
                            self.under.push((key.clone(), t, session));
                        }
                        self.locks.push((key, t, owner, lease_ms, false));
                        self.values.push((t, value));
                        ApplyResult::Granted { token: t, lease_ms, existing: false }
                    }
                }
            }
            Command::Release { key, token, user } => match self.position(&key) {
                Some(i) if self.locks[i].4 && token.is_some() => ApplyResult::NotFound { holder_token: None },
                Some(i) if token.is_none() || token == Some(self.locks[i].1) => {
                    if user.is_some_and(|user| !model_owned_by(&self.locks[i].2, &user)) {
                        return ApplyResult::Denied { token: self.locks[i].1 };
                    }
                    let released = self.locks.remove(i).1;
                    self.leave(released);
                    ApplyResult::Released { token: released }
                }
                other => ApplyResult::NotFound { holder_token: other.map(|i| self.locks[i].1) },
            },
            Command::Expire { key, token, delay } => match self.position(&key) {
                Some(i) if self.locks[i].1 == token => match (self.locks[i].4, delay) {
                    (false, Some(delay_ms)) => {
                        self.locks[i].3 = delay_ms;
                        self.locks[i].4 = true;
                        self.leave(token);
                        ApplyResult::Delayed { token, delay_ms }
                    }
                    (true, Some(_)) => ApplyResult::Expired { existed: false },
                    (_, None) => {
                        self.locks.remove(i);
                        self.leave(token);
                        ApplyResult::Expired { existed: true }
                    }
                },
                _ => ApplyResult::Expired { existed: false },
            },
            Command::Renew { key, token, lease_ms, user } => match self.position(&key) {
                Some(i) if self.locks[i].4 => ApplyResult::NotFound { holder_token: None },
                Some(i) if self.locks[i].1 == token => match user {
                    Some(user) if !model_owned_by(&self.locks[i].2, &user) => ApplyResult::Denied { token },
                    // Renews the session: the lock's lease is the session's.
                    _ if self.session_of(token).is_some() => {
                        ApplyResult::Renewed { token, lease_ms: self.locks[i].3 }
                    }
                    None => {
                        self.locks[i].3 = lease_ms;
                        ApplyResult::Renewed { token, lease_ms }
                    }
                    Some(_) => {
                        if lease_ms > self.locks[i].3 {
                            self.locks[i].3 = lease_ms;
                        }
                        ApplyResult::Renewed { token, lease_ms: self.locks[i].3 }
                    }
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
            Command::OpenSession { owner, ttl_ms } => {
                let Some(session) = self.next_token() else {
                    return ApplyResult::Invalid { reason: InvalidReason::TokensExhausted };
                };
                self.sessions.push((session, owner, ttl_ms));
                ApplyResult::Granted { token: session, lease_ms: ttl_ms, existing: false }
            }
            Command::RenewSession { session, user } => match self.owned(session, user.as_ref()) {
                Ok(ttl) => ApplyResult::Renewed { token: session, lease_ms: ttl },
                Err(refused) => refused,
            },
            Command::CloseSession { session, user } => match self.owned(session, user.as_ref()) {
                Ok(_) => {
                    self.end_session(session, &[]);
                    ApplyResult::Released { token: session }
                }
                Err(refused) => refused,
            },
            Command::ExpireSession { session, delays } => {
                if self.open(session).is_none() {
                    return ApplyResult::Expired { existed: false };
                }
                self.end_session(session, &delays);
                ApplyResult::Expired { existed: true }
            }
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

/// Lock-delay rules of an ExpireSession over the keys of [`arb_key`]: none,
/// or some of prefixes `""`, `"a"` and `"ab"`, each once.
fn arb_delays() -> impl Strategy<Value = Vec<(Vec<u8>, LeaseMs)>> {
    prop::collection::btree_map(prop::sample::select(vec!["", "a", "ab"]), arb_lease(), 0..=2).prop_map(
        |rules| rules.into_iter().map(|(prefix, delay)| (prefix.as_bytes().to_vec(), delay)).collect(),
    )
}

fn arb_command() -> impl Strategy<Value = Command> {
    prop_oneof![
        4 => (arb_key(), arb_lease(), arb_owner(), arb_value())
            .prop_map(|(key, lease_ms, owner, value)| Command::Grant { key, lease_ms, owner, value, session: None }),
        2 => (arb_key(), arb_lease(), arb_owner(), arb_value(), arb_token())
            .prop_map(|(key, lease_ms, owner, value, session)| Command::Grant { key, lease_ms, owner, value, session: Some(session) }),
        1 => (arb_key(), arb_token(), arb_value(), arb_user())
            .prop_map(|(key, token, value, user)| Command::Proclaim { key, token, value, user }),
        2 => (arb_key(), prop::option::weighted(0.8, arb_token()), arb_user()).prop_map(|(key, token, user)| Command::Release { key, token, user }),
        2 => (arb_key(), arb_token(), prop::option::weighted(0.4, arb_lease()))
            .prop_map(|(key, token, delay)| Command::Expire { key, token, delay }),
        2 => (arb_key(), arb_token(), arb_lease(), arb_user()).prop_map(|(key, token, lease_ms, user)| Command::Renew { key, token, lease_ms, user }),
        4 => (arb_key(), arb_lease(), arb_owner(), arb_share())
            .prop_map(|(key, lease_ms, owner, share)| Command::GrantShared { key, lease_ms, owner, share, session: None }),
        2 => (arb_key(), arb_lease(), arb_owner(), arb_share(), arb_token())
            .prop_map(|(key, lease_ms, owner, share, session)| Command::GrantShared { key, lease_ms, owner, share, session: Some(session) }),
        2 => (arb_owner(), arb_lease()).prop_map(|(owner, ttl_ms)| Command::OpenSession { owner, ttl_ms }),
        1 => (arb_token(), arb_user()).prop_map(|(session, user)| Command::RenewSession { session, user }),
        1 => (arb_token(), arb_user()).prop_map(|(session, user)| Command::CloseSession { session, user }),
        1 => (arb_token(), arb_delays()).prop_map(|(session, delays)| Command::ExpireSession { session, delays }),
        1 => Just(Command::Noop),
        1 => (1u8..=3, prop::sample::select(vec![0u64, 2, 5, 1_000, u64::MAX - 1]), 1u32..=3)
            .prop_map(|(n, token_floor, level)| Command::Bootstrap { cluster_id: ClusterId::new([n; 16]), token_floor, level }),
        1 => (1u32..=3).prop_map(|level| Command::RaiseLevel { level }),
    ]
}

/// Applies `history` to a table and to the [`Model`], both at `level`,
/// comparing every result and checking the session invariants after each
/// command, then compares what they hold.
fn behaves_like_the_model(history: Vec<Command>, level: u32) -> Result<(), TestCaseError> {
    let mut table = LockTable::at_level(level);
    let mut model = Model { level, ..Model::default() };
    for command in history {
        let command = retarget(command, &model);
        let expected = model.apply(&command);
        // The changes it reports are checked against the table's difference.
        let result = crate::change_tests::apply_checked(&mut table, command).map_err(TestCaseError::fail)?;
        prop_assert_eq!(result, expected);
        check_sessions(&table)?;
    }
    prop_assert_eq!(table.level(), model.level);
    let mut model_locks: Vec<_> = model
        .locks
        .iter()
        .map(|(k, t, o, l, d)| (k.clone(), *t, o.clone(), *l, *d, model.value_of(*t), model.session_of(*t)))
        .collect();
    model_locks.sort();
    let table_locks: Vec<_> = table
        .list(b"", usize::MAX)
        .map(|(k, l)| {
            (k.clone(), l.token, l.owner.clone(), l.lease_ms, l.delayed, l.value.clone(), l.session)
        })
        .collect();
    prop_assert_eq!(table_locks, model_locks);
    let mut model_shared: Vec<_> = model
        .shared
        .iter()
        .map(|(k, permits, holders)| {
            let mut holders: Vec<_> = holders
                .iter()
                .map(|(t, o, l, s, d)| (*t, o.clone(), *l, *s, *d, model.session_of(*t)))
                .collect();
            holders.sort_by_key(|(t, ..)| *t);
            (k.clone(), *permits, holders)
        })
        .collect();
    model_shared.sort_by(|a, b| a.0.cmp(&b.0));
    let table_shared: Vec<_> = table
        .list_shared(b"", usize::MAX)
        .map(|(k, shared)| {
            let holders: Vec<_> = shared
                .holders
                .iter()
                .map(|(t, h)| (*t, h.owner.clone(), h.lease_ms, h.share, h.delayed, h.session))
                .collect();
            (k.clone(), shared.permits, holders)
        })
        .collect();
    prop_assert_eq!(table_shared, model_shared);
    // The open sessions, each with what it holds.
    let mut model_sessions: Vec<_> = model
        .sessions
        .iter()
        .map(|(id, o, ttl)| {
            let mut holds: Vec<_> = model
                .under
                .iter()
                .filter(|(.., session)| session == id)
                .map(|(k, t, _)| (k.clone(), *t))
                .collect();
            holds.sort();
            (*id, o.clone(), *ttl, holds)
        })
        .collect();
    model_sessions.sort_by_key(|(id, ..)| *id);
    let table_sessions: Vec<_> = table
        .sessions()
        .map(|(id, s)| (id, s.owner.clone(), s.ttl_ms, s.holds.iter().cloned().collect::<Vec<_>>()))
        .collect();
    prop_assert_eq!(table_sessions, model_sessions);
    prop_assert_eq!(table.session_count(), model.sessions.len());
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
    prop_assert_eq!(
        table.len(),
        model.locks.len() + model.shared.iter().map(|(_, _, h)| h.len()).sum::<usize>()
    );
    prop_assert_eq!(table.last_token().map_or(0, FencingToken::get), model.last_token);
    prop_assert_eq!(table.cluster_id(), model.cluster_id);
    // Quotas count locks per identity: the owner before its first `/`;
    // a session counts as one, a holder held back for no one.
    let of_identity = |owner: &Owner, identity: &str| {
        owner.as_bytes().split(|byte| *byte == b'/').next() == Some(identity.as_bytes())
    };
    for identity in ["o1", "o2", "o3", "o12", "a", ""] {
        let held =
            model.locks.iter().filter(|(_, _, owner, _, delayed)| !*delayed && of_identity(owner, identity));
        let shared_held = model
            .shared
            .iter()
            .flat_map(|(_, _, holders)| holders)
            .filter(|holder| !holder.4)
            .filter(|(_, owner, ..)| of_identity(owner, identity))
            .count();
        let sessions = model.sessions.iter().filter(|(_, owner, _)| of_identity(owner, identity)).count();
        prop_assert_eq!(
            table.locks_of(identity.as_bytes()),
            held.count() + shared_held + sessions,
            "identity {}",
            identity
        );
    }
    // And so does a table restored from its snapshot.
    let restored = LockTable::restore(&table.snapshot()).unwrap();
    for identity in ["o1", "o2", "o3", "o12"] {
        prop_assert_eq!(restored.locks_of(identity.as_bytes()), table.locks_of(identity.as_bytes()));
    }
    prop_assert_eq!(restored, table);
    Ok(())
}

/// Points most generated tokens and session ids at what the model holds:
/// they are drawn from a small range, which long histories (and Bootstraps'
/// token floors) leave behind. `n` stands for itself when odd (a stale,
/// future or foreign token, a closed session). Otherwise a token of a
/// Release, Expire, Renew or Proclaim becomes the `n / 2`-th (cyclically)
/// holder of its key; a session command's id the `n / 2`-th open session; a
/// grant's id the `n / 2`-th open session too, whose owner the grant takes
/// when `n % 4` is 0 (so that many are granted; the others are mostly
/// another owner's).
fn retarget(mut command: Command, model: &Model) -> Command {
    let session = |n: u64| match model.sessions.len() {
        0 => None,
        len => Some(&model.sessions[(n / 2) as usize % len]),
    };
    let holder = |key: &Key, n: u64| {
        let mut held: Vec<FencingToken> =
            model.locks.iter().filter(|(k, ..)| k == key).map(|(_, held, ..)| *held).collect();
        for (_, _, holders) in model.shared.iter().filter(|(k, ..)| k == key) {
            held.extend(holders.iter().map(|(held, ..)| *held));
        }
        (!held.is_empty()).then(|| held[(n / 2) as usize % held.len()])
    };
    match &mut command {
        Command::Release { token: Some(t), .. }
        | Command::Expire { token: t, .. }
        | Command::Renew { token: t, .. }
        | Command::Proclaim { token: t, .. }
        | Command::RenewSession { session: t, .. }
        | Command::CloseSession { session: t, .. }
        | Command::ExpireSession { session: t, .. }
        | Command::Grant { session: Some(t), .. }
        | Command::GrantShared { session: Some(t), .. }
            if t.get() % 2 == 1 => {}
        Command::Release { key, token: Some(t), .. }
        | Command::Expire { key, token: t, .. }
        | Command::Renew { key, token: t, .. }
        | Command::Proclaim { key, token: t, .. } => *t = holder(key, t.get()).unwrap_or(*t),
        Command::RenewSession { session: id, .. }
        | Command::CloseSession { session: id, .. }
        | Command::ExpireSession { session: id, .. } => *id = session(id.get()).map_or(*id, |(s, ..)| *s),
        Command::Grant { session: Some(id), owner, .. }
        | Command::GrantShared { session: Some(id), owner, .. } => {
            if let Some((s, session_owner, _)) = session(id.get()) {
                if id.get() % 4 == 0 {
                    *owner = session_owner.clone();
                }
                *id = *s;
            }
        }
        _ => {}
    }
    command
}

/// Checks the session invariants of a table: a holder naming a session
/// names an open session of its own owner and has the session's TTL as its
/// lease; no holder held back names one; a session's holdings are exactly
/// the holders naming it; no session id is a holder's token.
fn check_sessions(table: &LockTable) -> Result<(), TestCaseError> {
    let plain =
        table.list(b"", usize::MAX).map(|(k, l)| (k, l.token, &l.owner, l.lease_ms, l.delayed, l.session));
    let shared = table.list_shared(b"", usize::MAX).flat_map(|(k, shared)| {
        shared.holders.iter().map(move |(t, h)| (k, *t, &h.owner, h.lease_ms, h.delayed, h.session))
    });
    let mut naming = Vec::new();
    for (k, t, o, lease_ms, delayed, session) in plain.chain(shared) {
        prop_assert!(table.session(t).is_none(), "session id {:?} is also a token of {}", t, k);
        let Some(session) = session else { continue };
        prop_assert!(!delayed, "{} is held back under session {:?}", k, session);
        let Some(open) = table.session(session) else {
            return Err(TestCaseError::fail(format!("{k} names session {session:?}, which is not open")));
        };
        prop_assert_eq!(&open.owner, o, "{} under another owner's session", k);
        prop_assert_eq!(open.ttl_ms, lease_ms, "{} under a session has a lease of its own", k);
        prop_assert_eq!(table.session_of(k.as_bytes(), t), Some(session));
        naming.push((session, k.clone(), t));
    }
    for (id, session) in table.sessions() {
        let mut named: Vec<(Key, FencingToken)> =
            naming.iter().filter(|(s, ..)| *s == id).map(|(_, k, t)| (k.clone(), *t)).collect();
        named.sort();
        let holds: Vec<(Key, FencingToken)> = session.holds.iter().cloned().collect();
        prop_assert_eq!(holds, named, "the holdings of session {:?}", id);
    }
    Ok(())
}

fn arb_history() -> impl Strategy<Value = Vec<Command>> {
    prop::collection::vec(arb_command(), 0..200)
}

/// A history where sessions are opened, hold keys and end more often than
/// in [`arb_history`]: the same commands, with more sessions, grants under
/// them and session ends mixed in.
fn arb_session_history() -> impl Strategy<Value = Vec<Command>> {
    // Even ids: each names an open session, if there is one (see [`retarget`]).
    let session = || (1u64..=6).prop_map(|n| Some(token(2 * n)));
    let step = prop_oneof![
        2 => (arb_owner(), arb_lease()).prop_map(|(owner, ttl_ms)| Command::OpenSession { owner, ttl_ms }),
        3 => (arb_key(), arb_lease(), arb_owner(), arb_value(), session())
            .prop_map(|(key, lease_ms, owner, value, session)| Command::Grant { key, lease_ms, owner, value, session }),
        3 => (arb_key(), arb_lease(), arb_owner(), arb_share(), session())
            .prop_map(|(key, lease_ms, owner, share, session)| Command::GrantShared { key, lease_ms, owner, share, session }),
        1 => (arb_token(), arb_delays()).prop_map(|(session, delays)| Command::ExpireSession { session, delays }),
    ];
    prop::collection::vec(prop_oneof![2 => arb_command(), 3 => step], 0..120)
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
/// every varint length: plain locks, read-write locks and semaphores, open
/// sessions, and holders under them (a session's own owner's, never held
/// back).
fn arb_snapshot_body() -> impl Strategy<Value = pb::TableSnapshot> {
    let lease = || arb_varint(31).prop_filter("a valid lease", |ms| *ms <= fencelock_types::LEASE_MS_MAX);
    let owner = || prop::collection::vec(any::<u8>(), 1..150);
    let under = || prop::option::of(any::<prop::sample::Index>());
    let records = prop::collection::btree_map(
        prop::collection::vec(any::<u8>(), 1..200),
        (owner(), lease(), any::<bool>(), prop::collection::vec(any::<u8>(), 0..40), under()),
        0..20,
    );
    // Keys of shared records: permits (0 for a read-write lock), and
    // holders: owner, lease, held back, a writer (alone), session.
    let shared = prop::collection::btree_map(
        prop::collection::vec(any::<u8>(), 1..20),
        (0u32..=3, prop::collection::vec((owner(), lease(), any::<bool>(), any::<bool>(), under()), 1..4)),
        0..4,
    );
    let sessions = prop::collection::vec((owner(), lease()), 0..6);
    let tokens = prop::collection::btree_set(arb_varint(63), 0..=36);
    let cluster_id = prop::option::of(any::<[u8; 16]>());
    let members = prop::collection::btree_map(
        arb_varint(64),
        ("[a-z0-9.-]{1,40}:[0-9]{1,5}", "[a-z0-9.]{1,40}:[0-9]{1,5}"),
        0..6,
    );
    (records, shared, sessions, tokens, arb_varint(20), cluster_id, members).prop_map(
        |(records, shared, sessions, tokens, extra, cluster_id, members)| {
            let last_token = tokens.iter().max().map_or(extra, |max| max + extra);
            let mut tokens = tokens.into_iter().rev();
            let mut sessions: Vec<pb::SessionRecord> = sessions
                .into_iter()
                .zip(&mut tokens)
                .map(|((owner, ttl_ms), session)| pb::SessionRecord {
                    session,
                    owner,
                    ttl_ms,
                    ..Default::default()
                })
                .collect();
            sessions.sort_by_key(|session| session.session);
            // The session a holder picked, and the owner it then has.
            let join = |pick: Option<prop::sample::Index>, delayed: bool, owner: Vec<u8>| match pick {
                Some(pick) if !delayed && !sessions.is_empty() => {
                    let session = &sessions[pick.index(sessions.len())];
                    (session.session, session.owner.clone())
                }
                _ => (0, owner),
            };
            let locks: Vec<pb::LockRecord> = records
                .iter()
                .zip(&mut tokens)
                .map(|((key, (owner, lease_ms, delayed, value, pick)), token)| {
                    let (session, owner) = join(*pick, *delayed, owner.clone());
                    pb::LockRecord {
                        key: key.clone(),
                        token,
                        owner,
                        lease_ms: *lease_ms,
                        delayed: *delayed,
                        value: value.clone(),
                        session,
                        ..Default::default()
                    }
                })
                .collect();
            let mut shared_records = Vec::new();
            for (key, (permits, holders)) in shared {
                if records.contains_key(&key) {
                    continue;
                }
                let mut kept: Vec<pb::HolderRecord> = Vec::new();
                for (owner, lease_ms, delayed, writer, pick) in holders {
                    let (session, owner) = join(pick, delayed, owner);
                    let share = match (permits, writer) {
                        (0, true) if kept.is_empty() => pb::Share::WRITE,
                        (0, _) if kept.iter().all(|h| h.share == pb::Share::READ) => pb::Share::READ,
                        (1.., _) if kept.len() < permits as usize => pb::Share::PERMIT,
                        _ => continue,
                    };
                    if kept.iter().any(|h| h.owner == owner) {
                        continue;
                    }
                    let Some(token) = tokens.next() else { break };
                    kept.push(pb::HolderRecord {
                        token,
                        owner,
                        lease_ms,
                        share,
                        delayed,
                        session,
                        ..Default::default()
                    });
                }
                kept.sort_by_key(|holder| holder.token);
                if !kept.is_empty() {
                    let record =
                        pb::SharedRecord { key, permits, holders: kept.into(), ..Default::default() };
                    shared_records.push(record);
                }
            }
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
            pb::TableSnapshot {
                last_token,
                locks: locks.into(),
                cluster_id,
                members,
                shared: shared_records.into(),
                sessions: sessions.into(),
                ..Default::default()
            }
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
    fn the_table_behaves_like_the_model(history in arb_history(), level in 1u32..=3) {
        // Level 1: a log as a cluster from before levels has it, where
        // shared keys and proclaims wait for a Bootstrap or RaiseLevel;
        // level 2, one where sessions do.
        behaves_like_the_model(history, level)?;
    }

    #[test]
    fn sessions_behave_like_the_model(history in arb_session_history()) {
        behaves_like_the_model(history, fencelock_types::LEVEL)?;
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
            // Whatever the command, every holder's token and every
            // session's id was issued.
            for (_, lock) in table.list(b"", usize::MAX) {
                prop_assert!(issued.contains(&lock.token));
            }
            for (id, _) in table.sessions() {
                prop_assert!(issued.contains(&id));
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
        session: None,
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
        session: None,
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

#[test]
fn a_shared_holders_proclaim_is_invalid_and_any_other_token_is_told_the_first_holder() {
    let mut table = LockTable::new();
    let proclaim = |k: &str, t: FencingToken, user: Option<&str>| Command::Proclaim {
        key: key(k),
        token: t,
        value: value("10.0.0.9:80"),
        user: user.map(owner),
    };
    let no_value = ApplyResult::Invalid { reason: InvalidReason::SharedHolderHasNoValue };
    let r1 = taken(&mut table, share_of("rw", "o1", Share::Read, None));
    let r2 = taken(&mut table, share_of("rw", "o2", Share::Read, None));
    let w = taken(&mut table, share_of("w", "o1", Share::Write, None));
    let p1 = taken(&mut table, share_of("sem", "o1", Share::Permit(2), None));
    let p2 = taken(&mut table, share_of("sem", "o2", Share::Permit(2), None));
    let before = table.snapshot();
    // Each live holder, a reader that is not the first, the writer, a
    // permit, is told it has no value to proclaim: not that it lost the
    // key, nor that another token holds it. Another user's proclaim of it
    // too: there is no value to deny it.
    for (k, t) in [("rw", r1), ("rw", r2), ("w", w), ("sem", p1), ("sem", p2)] {
        assert_eq!(table.apply(proclaim(k, t, None)), no_value, "{k} {t:?}");
        assert_eq!(table.apply(proclaim(k, t, Some("o9"))), no_value, "{k} {t:?}");
    }
    // A token that holds no place on the key: the first live holder's.
    assert_eq!(
        table.apply(proclaim("rw", token(99), None)),
        ApplyResult::NotFound { holder_token: Some(r1) }
    );
    assert_eq!(table.apply(proclaim("sem", w, None)), ApplyResult::NotFound { holder_token: Some(p1) });
    // Nothing changed: holders, tokens, leases, counts.
    assert_eq!(table.snapshot(), before);
    assert_eq!(holder_tokens(&table, "rw"), [r1, r2]);
    // Held back by lock-delay, a holder holds nothing: NotFound, naming the
    // first live holder (none once every holder is held back).
    table.apply(Command::Expire { key: key("sem"), token: p1, delay: Some(lease(500)) });
    assert_eq!(table.apply(proclaim("sem", p1, None)), ApplyResult::NotFound { holder_token: Some(p2) });
    assert_eq!(table.apply(proclaim("sem", p2, None)), no_value);
    table.apply(Command::Expire { key: key("w"), token: w, delay: Some(lease(500)) });
    assert_eq!(table.apply(proclaim("w", w, None)), ApplyResult::NotFound { holder_token: None });
    // A plain lock's holder still proclaims.
    let plain = granted(&mut table, "plain", "o1");
    assert_eq!(table.apply(proclaim("plain", plain, None)), ApplyResult::Proclaimed { token: plain });
    assert_eq!(table.holder(b"plain").unwrap().value, value("10.0.0.9:80"));
}

// ---------------------------------------------------------------------------
// Sessions

/// Opens a session of `o` with a TTL of `ttl_ms`, and returns its id.
fn opened(table: &mut LockTable, o: &str, ttl_ms: u64) -> FencingToken {
    match table.apply(Command::OpenSession { owner: owner(o), ttl_ms: lease(ttl_ms) }) {
        ApplyResult::Granted { token, lease_ms, existing: false } if lease_ms == lease(ttl_ms) => token,
        other => panic!("expected the session Granted, got {other:?}"),
    }
}

/// A Grant of `k` for `o` under `session` (its lease is ignored).
fn grant_under(k: &str, o: &str, session: FencingToken) -> Command {
    Command::Grant {
        key: key(k),
        lease_ms: lease(1000),
        owner: owner(o),
        value: Value::none(),
        session: Some(session),
    }
}

/// A GrantShared of `k` for `o` in `share`, under `session` if any.
fn share_of(k: &str, o: &str, share: Share, session: Option<FencingToken>) -> Command {
    Command::GrantShared { key: key(k), lease_ms: lease(1000), owner: owner(o), share, session }
}

/// The new token `command` is granted, or a panic.
fn taken(table: &mut LockTable, command: Command) -> FencingToken {
    match table.apply(command) {
        ApplyResult::Granted { token, existing: false, .. } => token,
        other => panic!("expected Granted, got {other:?}"),
    }
}

/// The tokens of `key`'s shared holders.
fn holder_tokens(table: &LockTable, k: &str) -> Vec<FencingToken> {
    table.shared(k.as_bytes()).map_or_else(Vec::new, |shared| shared.holders.keys().copied().collect())
}

#[test]
fn a_lapsed_session_frees_everything_it_held_in_one_apply() {
    let mut table = LockTable::new();
    let s = opened(&mut table, "o1", 5_000);
    let plain = taken(&mut table, grant_under("a", "o1", s));
    let reader = taken(&mut table, share_of("rw", "o1", Share::Read, Some(s)));
    let other_reader = taken(&mut table, share_of("rw", "o2", Share::Read, None));
    let writer = taken(&mut table, share_of("w", "o1", Share::Write, Some(s)));
    let permit = taken(&mut table, share_of("sem", "o1", Share::Permit(2), Some(s)));
    let other_permit = taken(&mut table, share_of("sem", "o2", Share::Permit(2), None));
    let own = granted(&mut table, "b", "o1");
    let holds: Vec<(Key, FencingToken)> = table.session(s).unwrap().holds.iter().cloned().collect();
    assert_eq!(holds, [(key("a"), plain), (key("rw"), reader), (key("sem"), permit), (key("w"), writer)]);
    assert_eq!(table.session_of(b"a", plain), Some(s));
    assert_eq!(table.session_of(b"rw", other_reader), None);
    // The session counts as one lock of o1, beside the five it holds.
    assert_eq!(table.locks_of(b"o1"), 6);

    let last = table.last_token();
    let expire = Command::ExpireSession { session: s, delays: Vec::new() };
    assert_eq!(table.apply(expire.clone()), ApplyResult::Expired { existed: true });
    assert_eq!(table.last_token(), last, "an expiry issues no token");
    assert!(table.holder(b"a").is_none() && table.shared(b"w").is_none());
    assert_eq!(holder_tokens(&table, "rw"), [other_reader]);
    assert_eq!(holder_tokens(&table, "sem"), [other_permit]);
    assert_eq!(table.holder(b"b").unwrap().token, own);
    assert_eq!((table.locks_of(b"o1"), table.locks_of(b"o2")), (1, 2));
    assert_eq!((table.session_count(), table.session(s)), (0, None));
    assert_eq!(table.len(), 3);
    // The session is gone for every command naming it.
    assert_eq!(table.apply(expire), ApplyResult::Expired { existed: false });
    assert_eq!(
        table.apply(Command::RenewSession { session: s, user: None }),
        ApplyResult::NoSession { session: s }
    );
    assert_eq!(
        table.apply(Command::CloseSession { session: s, user: None }),
        ApplyResult::NoSession { session: s }
    );
    assert_eq!(table.apply(grant_under("a", "o1", s)), ApplyResult::NoSession { session: s });
    // Its keys are free, for the next holders' greater tokens.
    assert!(taken(&mut table, share_of("w", "o3", Share::Write, None)) > last.unwrap());
    assert!(granted(&mut table, "a", "o3") > last.unwrap());
}

#[test]
fn a_lapsed_sessions_holders_under_a_delay_rule_are_held_back_and_leave_it() {
    let mut table = LockTable::new();
    let s = opened(&mut table, "o1", 5_000);
    let plain = taken(&mut table, grant_under("a/1", "o1", s));
    let reader = taken(&mut table, share_of("ab", "o1", Share::Read, Some(s)));
    let other = taken(&mut table, share_of("ab", "o2", Share::Read, None));
    taken(&mut table, grant_under("b", "o1", s));
    // The longest prefix rules: "ab" for key ab, "a" for key a/1, none for b.
    let delays = vec![(b"a".to_vec(), lease(5_000)), (b"ab".to_vec(), lease(700))];
    assert_eq!(
        table.apply(Command::ExpireSession { session: s, delays }),
        ApplyResult::Expired { existed: true }
    );
    let lock = table.holder(b"a/1").unwrap();
    assert!(lock.delayed && lock.token == plain && lock.lease_ms == lease(5_000) && lock.session.is_none());
    let held_back = &table.shared(b"ab").unwrap().holders[&reader];
    assert!(held_back.delayed && held_back.lease_ms == lease(700) && held_back.session.is_none());
    assert!(table.holds(b"ab", other) && !table.holds(b"ab", reader));
    assert!(table.holder(b"b").is_none());
    // Held back holders count for no one; the session is closed.
    assert_eq!(table.locks_of(b"o1"), 0);
    assert_eq!(table.session_count(), 0);
    assert_eq!(LockTable::restore(&table.snapshot()).unwrap(), table);
    // Held back as any expiry is: granted to no one, under a new session
    // of the same owner either, until an Expire of its token without a
    // delay.
    let again = opened(&mut table, "o1", 5_000);
    assert_eq!(
        table.apply(grant_under("a/1", "o1", again)),
        ApplyResult::GrantRejected { holder_token: plain }
    );
    assert!(table.session(again).unwrap().holds.is_empty());
    let lift = |k: &str, t| Command::Expire { key: key(k), token: t, delay: None };
    assert_eq!(table.apply(lift("a/1", plain)), ApplyResult::Expired { existed: true });
    assert_eq!(table.apply(lift("ab", reader)), ApplyResult::Expired { existed: true });
    assert_eq!(holder_tokens(&table, "ab"), [other]);
    assert!(matches!(
        table.apply(grant_under("a/1", "o1", again)),
        ApplyResult::Granted { existing: false, .. }
    ));
}

#[test]
fn closing_a_session_releases_everything_at_once_without_delay() {
    let mut table = LockTable::new();
    let s = opened(&mut table, "bob/w", 2_000);
    taken(&mut table, grant_under("a", "bob/w", s));
    taken(&mut table, share_of("rw", "bob/w", Share::Write, Some(s)));
    taken(&mut table, share_of("sem", "bob/w", Share::Permit(3), Some(s)));
    assert_eq!(table.locks_of(b"bob"), 4);
    let close = |user: Option<&str>| Command::CloseSession { session: s, user: user.map(owner) };
    let before = table.clone();
    for other in ["alice", "bo", "bobby"] {
        assert_eq!(table.apply(close(Some(other))), ApplyResult::Denied { token: s }, "user {other}");
    }
    assert_eq!(table, before);
    assert_eq!(table.apply(close(Some("bob"))), ApplyResult::Released { token: s });
    // Nothing held back: every key is free at once.
    assert!(table.is_empty());
    assert_eq!((table.session_count(), table.locks_of(b"bob")), (0, 0));
    assert_eq!(table.last_token(), before.last_token());
    assert_eq!(table.apply(close(None)), ApplyResult::NoSession { session: s });
    // Without a user (no TLS), anyone's session closes.
    let s2 = opened(&mut table, "carol", 2_000);
    assert_eq!(
        table.apply(Command::CloseSession { session: s2, user: None }),
        ApplyResult::Released { token: s2 }
    );
}

#[test]
fn a_grant_under_a_session_that_is_not_open_is_no_session_and_changes_nothing() {
    let mut table = LockTable::new();
    opened(&mut table, "o1", 1_000);
    let lock = granted(&mut table, "a", "o1");
    let closed = opened(&mut table, "o1", 1_000);
    table.apply(Command::CloseSession { session: closed, user: None });
    let before = table.snapshot();
    // Never issued, a lock's token, a closed session.
    for session in [token(99), lock, closed] {
        let refused = ApplyResult::NoSession { session };
        assert_eq!(table.apply(grant_under("b", "o1", session)), refused);
        assert_eq!(table.apply(share_of("rw", "o1", Share::Read, Some(session))), refused);
        // A retry of a held key as well.
        assert_eq!(table.apply(grant_under("a", "o1", session)), refused);
        assert_eq!(table.apply(Command::RenewSession { session, user: None }), refused);
    }
    assert_eq!(table.snapshot(), before, "no token consumed, nothing held");
}

#[test]
fn a_grant_under_another_owners_session_is_denied() {
    let mut table = LockTable::new();
    let s = opened(&mut table, "o1", 1_000);
    let before = table.snapshot();
    // The owner must be the session's exactly, not merely of its user.
    for other in ["o2", "o1/a", "o12"] {
        assert_eq!(table.apply(grant_under("a", other, s)), ApplyResult::Denied { token: s });
        assert_eq!(
            table.apply(share_of("rw", other, Share::Read, Some(s))),
            ApplyResult::Denied { token: s }
        );
    }
    assert_eq!(table.snapshot(), before);
}

#[test]
fn renewing_or_closing_a_session_with_a_user_not_owning_it_is_denied() {
    let mut table = LockTable::new();
    let s = opened(&mut table, "bob/w", 3_000);
    let renew = |user: Option<&str>| Command::RenewSession { session: s, user: user.map(owner) };
    let close = |user: Option<&str>| Command::CloseSession { session: s, user: user.map(owner) };
    let before = table.clone();
    for other in ["alice", "bo", "bobby"] {
        assert_eq!(table.apply(renew(Some(other))), ApplyResult::Denied { token: s });
        assert_eq!(table.apply(close(Some(other))), ApplyResult::Denied { token: s });
    }
    // Its user, or no user, renews it for its TTL; nothing changes.
    let renewed = ApplyResult::Renewed { token: s, lease_ms: lease(3_000) };
    assert_eq!(table.apply(renew(Some("bob"))), renewed);
    assert_eq!(table.apply(renew(None)), renewed);
    assert_eq!(table, before);
}

#[test]
fn a_renew_of_a_session_held_lock_renews_the_session_and_not_the_locks_lease() {
    let mut table = LockTable::new();
    let s = opened(&mut table, "bob/w", 4_000);
    // The grant's own lease is ignored: the lock has the session's.
    assert_eq!(
        table.apply(grant_under("a", "bob/w", s)),
        ApplyResult::Granted { token: token(2), lease_ms: lease(4_000), existing: false }
    );
    let reader = taken(&mut table, share_of("rw", "bob/w", Share::Read, Some(s)));
    let before = table.clone();
    for (k, t) in [("a", token(2)), ("rw", reader)] {
        let renew = |user: Option<&str>| Command::Renew {
            key: key(k),
            token: t,
            lease_ms: lease(60_000),
            user: user.map(owner),
        };
        let renewed = ApplyResult::Renewed { token: t, lease_ms: lease(4_000) };
        assert_eq!(table.apply(renew(None)), renewed);
        assert_eq!(table.apply(renew(Some("bob"))), renewed);
        assert_eq!(table.apply(renew(Some("alice"))), ApplyResult::Denied { token: t });
    }
    assert_eq!(table, before);
    assert_eq!(table.holder(b"a").unwrap().lease_ms, lease(4_000));
    assert_eq!(table.shared(b"rw").unwrap().holders[&reader].lease_ms, lease(4_000));
}

#[test]
fn a_retried_grant_by_the_holder_keeps_its_lock_under_its_session() {
    let mut table = LockTable::new();
    let s = opened(&mut table, "o1", 4_000);
    let other = opened(&mut table, "o1", 9_000);
    let plain = taken(&mut table, grant_under("a", "o1", s));
    let reader = taken(&mut table, share_of("rw", "o1", Share::Read, Some(s)));
    let last = table.last_token();
    assert_eq!(
        table.apply(grant_under("a", "o1", s)),
        ApplyResult::Granted { token: plain, lease_ms: lease(4_000), existing: true }
    );
    assert_eq!(
        table.apply(share_of("rw", "o1", Share::Read, Some(s))),
        ApplyResult::Granted { token: reader, lease_ms: lease(4_000), existing: true }
    );
    // Asked under another session, or none: the owner holds the key once,
    // so it is turned away by its own token, and nothing moves.
    let elsewhere = [
        grant_under("a", "o1", other),
        Command::Grant {
            key: key("a"),
            lease_ms: lease(60_000),
            owner: owner("o1"),
            value: Value::none(),
            session: None,
        },
    ];
    for retry in elsewhere {
        assert_eq!(table.apply(retry), ApplyResult::GrantRejected { holder_token: plain });
        let lock = table.holder(b"a").unwrap();
        assert_eq!((lock.session, lock.lease_ms), (Some(s), lease(4_000)));
    }
    for session in [Some(other), None] {
        assert_eq!(
            table.apply(share_of("rw", "o1", Share::Read, session)),
            ApplyResult::GrantRejected { holder_token: reader }
        );
        assert_eq!(table.session_of(b"rw", reader), Some(s));
    }
    assert_eq!(table.last_token(), last);
    assert_eq!(table.session(s).unwrap().holds.len(), 2);
    assert!(table.session(other).unwrap().holds.is_empty());
    // A lock of a lease of its own, asked again under a session, stays on
    // its own lease, and the asker is told it is not the session's.
    let own = granted(&mut table, "b", "o1");
    assert_eq!(table.apply(grant_under("b", "o1", s)), ApplyResult::GrantRejected { holder_token: own });
    assert_eq!(table.holder(b"b").unwrap().session, None);
    assert_eq!(table.session(s).unwrap().holds.len(), 2);
}

#[test]
fn session_ids_and_lock_tokens_come_from_one_counter_and_never_repeat() {
    let mut table = LockTable::new();
    let mut issued = Vec::new();
    let mut note = |result: ApplyResult| {
        if let Some(token) = token_of(&result) {
            issued.push(token);
        }
    };
    let s1 = opened(&mut table, "o1", 1_000);
    note(table.apply(grant_under("a", "o1", s1)));
    note(table.apply(grant("b", "o2")));
    note(table.apply(Command::OpenSession { owner: owner("o2"), ttl_ms: lease(1_000) }));
    note(table.apply(share_of("rw", "o1", Share::Read, Some(s1))));
    note(table.apply(Command::CloseSession { session: s1, user: None }));
    note(table.apply(Command::OpenSession { owner: owner("o1"), ttl_ms: lease(1_000) }));
    note(table.apply(grant("a", "o3")));
    note(table.apply(Command::ExpireSession { session: token(4), delays: Vec::new() }));
    note(table.apply(Command::OpenSession { owner: owner("o1"), ttl_ms: lease(1_000) }));
    issued.insert(0, s1);
    // One counter: 1, 2, 3, ... for sessions and holders alike.
    assert_eq!(issued, (1..=8).map(token).collect::<Vec<_>>());
    // And it carries on past a snapshot.
    let mut restored = LockTable::restore(&table.snapshot()).unwrap();
    assert_eq!(opened(&mut restored, "o1", 1_000), token(9));
    assert_eq!(granted(&mut restored, "c", "o1"), token(10));
}

#[test]
fn session_commands_and_grants_under_a_session_need_level_3() {
    let mut table = LockTable::at_level(2);
    let refused = ApplyResult::Invalid { reason: InvalidReason::LevelNotReached };
    let commands = [
        Command::OpenSession { owner: owner("o1"), ttl_ms: lease(1_000) },
        Command::RenewSession { session: token(1), user: None },
        Command::CloseSession { session: token(1), user: None },
        Command::ExpireSession { session: token(1), delays: Vec::new() },
        grant_under("a", "o1", token(1)),
        share_of("rw", "o1", Share::Read, Some(token(1))),
    ];
    for command in commands.clone() {
        assert_eq!(command.level(), 3);
        assert_eq!(table.apply(command), refused);
    }
    assert_eq!(table, LockTable::at_level(2));
    // Without a session, grants apply as before.
    assert_eq!(granted(&mut table, "a", "o1"), token(1));
    assert_eq!(taken(&mut table, share_of("rw", "o1", Share::Read, None)), token(2));
    table.apply(Command::RaiseLevel { level: 3 });
    assert_eq!(opened(&mut table, "o1", 1_000), token(3));
    assert_eq!(taken(&mut table, grant_under("b", "o1", token(3))), token(4));
}

/// A table with sessions: one holding a plain lock, a reader and a permit,
/// one holding nothing, and a holder a lapsed session left held back.
fn session_table() -> LockTable {
    let mut table = LockTable::new();
    let s1 = opened(&mut table, "o1", 1_000);
    let s2 = opened(&mut table, "o2/x", 30_000);
    let lapsed = opened(&mut table, "o3", 500);
    taken(&mut table, grant_under("a", "o1", s1));
    taken(&mut table, share_of("rw", "o1", Share::Read, Some(s1)));
    taken(&mut table, share_of("rw", "o2", Share::Read, None));
    taken(&mut table, share_of("sem", "o1", Share::Permit(2), Some(s1)));
    taken(&mut table, share_of("sem", "o3", Share::Permit(2), Some(lapsed)));
    taken(&mut table, grant_under("c", "o3", lapsed));
    granted(&mut table, "b", "o2/x");
    table.apply(Command::ExpireSession { session: lapsed, delays: vec![(b"s".to_vec(), lease(2_000))] });
    assert!(table.session(s2).unwrap().holds.is_empty());
    table
}

#[test]
fn sessions_travel_in_snapshots_byte_for_byte() {
    let table = session_table();
    let bytes = table.snapshot();
    let restored = LockTable::restore(&bytes).unwrap();
    assert_eq!(restored, table);
    assert_eq!(restored.snapshot(), bytes);
    let sessions: Vec<_> = restored.sessions().map(|(id, s)| (id, s.holds.len())).collect();
    assert_eq!(sessions, [(token(1), 3), (token(2), 0)]);
    for identity in ["o1", "o2", "o3"] {
        assert_eq!(restored.locks_of(identity.as_bytes()), table.locks_of(identity.as_bytes()));
    }
    assert_eq!((restored.locks_of(b"o1"), restored.locks_of(b"o2")), (4, 3));
    // The restored table carries on as the original does.
    let (mut one, mut two) = (table, restored);
    for command in [
        Command::ExpireSession { session: token(1), delays: vec![(b"r".to_vec(), lease(100))] },
        Command::CloseSession { session: token(2), user: None },
    ] {
        assert_eq!(one.apply(command.clone()), two.apply(command));
        assert_eq!(one.snapshot(), two.snapshot());
    }
    // Every truncation and every bit flip is refused.
    for len in 0..bytes.len() {
        assert!(LockTable::restore(&bytes[..len]).is_err(), "truncated to {len} bytes");
    }
    for i in 0..bytes.len() {
        for bit in 0..8 {
            let mut corrupt = bytes.clone();
            corrupt[i] ^= 1 << bit;
            assert!(LockTable::restore(&corrupt).is_err(), "flip of bit {bit} in byte {i}");
        }
    }
}

/// A snapshot's record of session `id` of `o`, with a TTL of 1 s.
fn session_record(id: u64, o: &str) -> pb::SessionRecord {
    pb::SessionRecord { session: id, owner: o.as_bytes().to_vec(), ttl_ms: 1_000, ..Default::default() }
}

#[test]
fn snapshots_with_broken_sessions_are_refused() {
    // Sessions 1 (o1's, holding lock a) and 3 (o2's, holding reader 4 of
    // rw), and 5 (o1's, holding nothing).
    let body = |sessions: Vec<pb::SessionRecord>, lock: pb::LockRecord, holder: pb::HolderRecord| {
        pb::TableSnapshot {
            last_token: 6,
            locks: vec![lock].into(),
            shared: vec![shared_record("rw", 0, vec![holder])].into(),
            sessions: sessions.into(),
            ..Default::default()
        }
    };
    let sessions = || vec![session_record(1, "o1"), session_record(3, "o2"), session_record(5, "o1")];
    let lock = |session| pb::LockRecord { owner: b"o1".to_vec(), session, ..record("a", 2) };
    let reader = |session| pb::HolderRecord { session, ..holder_record(4, "o2", pb::Share::READ) };
    let table = LockTable::restore(&framed(&body(sessions(), lock(1), reader(3)))).unwrap();
    assert_eq!(table.session_of(b"a", token(2)), Some(token(1)));
    assert_eq!(table.session_of(b"rw", token(4)), Some(token(3)));
    assert_eq!(table.session(token(3)).unwrap().holds.len(), 1);
    assert!(table.session(token(5)).unwrap().holds.is_empty());
    assert_eq!(table.locks_of(b"o1"), 3);

    let out = |k: &str, session| SnapshotError::HolderOutOfSession { key: key(k), session };
    let invalid = |index, reason| SnapshotError::InvalidSession { index, reason };
    let cases = [
        // A holder naming a session not in the snapshot, another owner's
        // (exactly the owner: not one of its user's), or held back.
        (body(sessions(), lock(6), reader(3)), out("a", 6)),
        (body(sessions(), lock(3), reader(3)), out("a", 3)),
        (body(sessions(), pb::LockRecord { owner: b"o1/x".to_vec(), ..lock(1) }, reader(3)), out("a", 1)),
        (body(sessions(), pb::LockRecord { delayed: true, ..lock(1) }, reader(3)), out("a", 1)),
        (body(sessions(), lock(1), reader(1)), out("rw", 1)),
        (body(sessions(), lock(1), reader(2)), out("rw", 2)),
        (body(sessions(), lock(1), pb::HolderRecord { delayed: true, ..reader(3) }), out("rw", 3)),
        // Session records: id 0, out of order or repeated, past the last
        // token, a bad owner or TTL.
        (body(vec![session_record(0, "o9")], lock(0), reader(0)), invalid(0, "session 0")),
        (
            body(vec![session_record(3, "o2"), session_record(1, "o1")], lock(1), reader(3)),
            invalid(1, "out of id order"),
        ),
        (
            body(vec![session_record(1, "o1"), session_record(1, "o1")], lock(1), reader(0)),
            invalid(1, "out of id order"),
        ),
        (
            body(vec![session_record(7, "o1")], lock(0), reader(0)),
            invalid(0, "an id past the last issued token"),
        ),
        (body(vec![session_record(1, "")], lock(0), reader(0)), invalid(0, "a bad owner")),
        (
            body(vec![pb::SessionRecord { ttl_ms: 0, ..session_record(1, "o1") }], lock(0), reader(0)),
            invalid(0, "a bad ttl"),
        ),
        // A session id that is also a holder's token.
        (
            body(vec![session_record(2, "o1")], lock(0), reader(0)),
            SnapshotError::DuplicateToken { index: 0, token: token(2) },
        ),
        (
            body(vec![session_record(4, "o1")], lock(0), reader(0)),
            SnapshotError::DuplicateToken { index: 0, token: token(4) },
        ),
    ];
    for (i, (body, expected)) in cases.into_iter().enumerate() {
        assert_eq!(LockTable::restore(&framed(&body)), Err(expected), "case {i}");
    }
}
