//! Tests of the deadline tracker, with a reference model for random
//! sequences of changes and clock readings.

use proptest::prelude::*;

use crate::LeaseTracker;
use fencelock_types::{FencingToken, Key, LeaseMs};

fn key(name: &str) -> Key {
    Key::new(name.as_bytes().to_vec()).unwrap()
}

fn token(value: u64) -> FencingToken {
    FencingToken::new(value).unwrap()
}

fn lease(ms: u64) -> LeaseMs {
    LeaseMs::new(ms).unwrap()
}

#[test]
fn a_lease_is_due_exactly_at_apply_time_plus_lease() {
    let mut leases = LeaseTracker::new();
    leases.granted(key("a"), token(1), lease(100), 1_000);
    assert!(!leases.is_due(&key("a"), token(1), 1_099));
    assert!(leases.is_due(&key("a"), token(1), 1_100));
    assert!(!leases.is_due(&key("a"), token(2), 1_100), "another token is never due");
    assert_eq!(leases.next_deadline_ms(), Some(1_100));
}

#[test]
fn removal_needs_the_holding_token() {
    let mut leases = LeaseTracker::new();
    leases.granted(key("a"), token(1), lease(100), 0);
    leases.removed(&key("a"), token(1));
    leases.granted(key("a"), token(2), lease(100), 50);
    // A late removal of the old lock leaves the new one alone.
    leases.removed(&key("a"), token(1));
    assert_eq!(leases.lease(&key("a")).unwrap().token, token(2));
    assert_eq!(leases.due(149).count(), 0);
    assert_eq!(leases.due(150).count(), 1);
}

#[test]
fn due_lists_in_deadline_order_and_stops_at_now() {
    let mut leases = LeaseTracker::new();
    leases.granted(key("late"), token(1), lease(300), 0);
    leases.granted(key("early"), token(2), lease(100), 0);
    leases.granted(key("middle"), token(3), lease(200), 0);
    let due: Vec<_> = leases.due(250).map(|(k, t)| (k.to_string(), t.get())).collect();
    assert_eq!(due, [("early".to_owned(), 2), ("middle".to_owned(), 3)]);
}

#[test]
fn a_clock_going_backwards_never_brings_a_deadline_closer() {
    let mut leases = LeaseTracker::new();
    leases.granted(key("a"), token(1), lease(100), 1_000);
    leases.renewed(key("a"), token(1), lease(100), 500);
    assert_eq!(leases.lease(&key("a")).unwrap().deadline_ms, 1_100);
}

#[test]
fn restore_gives_every_lock_a_full_lease_from_now() {
    let mut leases = LeaseTracker::new();
    leases.granted(key("gone"), token(1), lease(10), 0);
    leases.restore([(key("a"), token(5), lease(100)), (key("b"), token(6), lease(300))], 2_000);
    assert!(leases.lease(&key("gone")).is_none());
    assert_eq!(leases.lease(&key("a")).unwrap().deadline_ms, 2_100);
    assert_eq!(leases.lease(&key("b")).unwrap().deadline_ms, 2_300);
    assert_eq!(leases.len(), 2);
}

#[derive(Clone, Debug)]
enum Change {
    Granted(u8, u64, u64),
    Renewed(u8, u64, u64),
    Removed(u8, u64),
    Advance(u64),
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        (0u8..4, 1u64..6, 1u64..500).prop_map(|(k, t, l)| Change::Granted(k, t, l)),
        (0u8..4, 1u64..6, 1u64..500).prop_map(|(k, t, l)| Change::Renewed(k, t, l)),
        (0u8..4, 1u64..6).prop_map(|(k, t)| Change::Removed(k, t)),
        (0u64..300).prop_map(Change::Advance),
    ]
}

proptest! {
    /// Against a model that stores (token, deadline) per key and scans all.
    #[test]
    fn the_tracker_matches_a_linear_model(changes in prop::collection::vec(change(), 0..100)) {
        let mut leases = LeaseTracker::new();
        let mut model: Vec<Option<(u64, u64)>> = vec![None; 4];
        let mut now = 0u64;
        for change in changes {
            match change {
                Change::Granted(k, t, l) | Change::Renewed(k, t, l) => {
                    let name = format!("k{k}");
                    if matches!(change, Change::Granted(..)) {
                        leases.granted(key(&name), token(t), lease(l), now);
                    } else {
                        leases.renewed(key(&name), token(t), lease(l), now);
                    }
                    model[k as usize] = Some((t, now + l));
                }
                Change::Removed(k, t) => {
                    leases.removed(&key(&format!("k{k}")), token(t));
                    if model[k as usize].is_some_and(|(held, _)| held == t) {
                        model[k as usize] = None;
                    }
                }
                Change::Advance(ms) => now += ms,
            }
            let mut expected: Vec<(u64, String, u64)> = model
                .iter()
                .enumerate()
                .filter_map(|(k, lease)| lease.filter(|(_, deadline)| *deadline <= now).map(|(t, d)| (d, format!("k{k}"), t)))
                .collect();
            expected.sort();
            let expected: Vec<(String, u64)> = expected.into_iter().map(|(_, k, t)| (k, t)).collect();
            let actual: Vec<(String, u64)> = leases.due(now).map(|(k, t)| (k.to_string(), t.get())).collect();
            prop_assert_eq!(actual, expected);
            prop_assert_eq!(leases.len(), model.iter().flatten().count());
        }
    }
}
