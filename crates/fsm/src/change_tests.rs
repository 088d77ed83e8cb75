//! The changes a command reports ([`crate::Change`]) checked against an
//! oracle of their own: the difference between what the table holds
//! before and after the command, read through its public accessors, with
//! the command and its result. Run on every command of the model tests'
//! random histories, and on examples of the corner cases.

use std::collections::BTreeMap;

use fencelock_types::{ApplyResult, Command, FencingToken, Key, LeaseMs, Owner, Value};

use crate::{Change, LockTable};

/// What the table says of one holder (a plain lock, or a shared key's).
#[derive(Clone, Debug, PartialEq)]
struct Held {
    owner: Owner,
    value: Value,
    lease_ms: LeaseMs,
    delayed: bool,
    shared: bool,
    session: Option<FencingToken>,
}

/// Every holder by key and token, and every open session with its TTL.
type View = (BTreeMap<(Key, FencingToken), Held>, BTreeMap<FencingToken, LeaseMs>);

fn view(table: &LockTable) -> View {
    let mut held = BTreeMap::new();
    for (key, lock) in table.list(b"", usize::MAX) {
        let entry = Held {
            owner: lock.owner.clone(),
            value: lock.value.clone(),
            lease_ms: lock.lease_ms,
            delayed: lock.delayed,
            shared: false,
            session: lock.session,
        };
        held.insert((key.clone(), lock.token), entry);
    }
    for (key, shared) in table.list_shared(b"", usize::MAX) {
        for (token, holder) in shared.holders.iter() {
            let entry = Held {
                owner: holder.owner.clone(),
                value: Value::none(),
                lease_ms: holder.lease_ms,
                delayed: holder.delayed,
                shared: true,
                session: holder.session,
            };
            held.insert((key.clone(), *token), entry);
        }
    }
    let sessions = table.sessions().map(|(id, session)| (id, session.ttl_ms)).collect();
    (held, sessions)
}

/// The changes `command`, answered `result`, should report, given what the
/// table held before and after it, in a canonical order (a session's end
/// last).
fn expected(before: &View, after: &View, command: &Command, result: &ApplyResult) -> Vec<Change> {
    let (held_before, sessions_before) = before;
    let (held_after, sessions_after) = after;
    let mut changes = Vec::new();
    let released = matches!(command, Command::Release { .. } | Command::CloseSession { .. });
    let forced = matches!(command, Command::Release { token: None, .. });
    for ((key, token), now) in held_after {
        let (key, token, shared, session) = (key.clone(), *token, now.shared, now.session);
        match held_before.get(&(key.clone(), token)) {
            None => changes.push(Change::Granted {
                key,
                token,
                lease_ms: now.lease_ms,
                existing: false,
                shared,
                session,
            }),
            Some(was) if !was.delayed && now.delayed => {
                changes.push(Change::Delayed { key, token, shared, delay_ms: now.lease_ms })
            }
            Some(_) => {}
        }
    }
    for ((key, token), was) in held_before {
        if held_after.contains_key(&(key.clone(), *token)) {
            continue;
        }
        let (key, token, shared, owner, value) =
            (key.clone(), *token, was.shared, was.owner.clone(), was.value.clone());
        changes.push(match (was.delayed, released) {
            (true, _) => Change::DelayLifted { key, token, shared, forced: released, owner, value },
            (false, true) => Change::Released { key, token, shared, forced, owner, value },
            (false, false) => Change::Expired { key, token, shared, owner, value },
        });
    }
    // What leaves no trace in who holds what: a retried grant, a renewal,
    // a proclaim, a session's open and keep-alive.
    let held_now = |key: &Key, token: FencingToken| held_after.get(&(key.clone(), token)).cloned();
    match (command, result) {
        (
            Command::Grant { key, .. } | Command::GrantShared { key, .. },
            ApplyResult::Granted { token, lease_ms, existing: true },
        ) => {
            let now = held_now(key, *token).expect("a retried grant's holder is in the table");
            changes.push(Change::Granted {
                key: key.clone(),
                token: *token,
                lease_ms: *lease_ms,
                existing: true,
                shared: now.shared,
                session: now.session,
            });
        }
        (Command::Renew { key, .. }, ApplyResult::Renewed { token, lease_ms }) => {
            let now = held_now(key, *token).expect("a renewed holder is in the table");
            let (shared, session) = (now.shared, now.session);
            changes.push(Change::Renewed {
                key: key.clone(),
                token: *token,
                lease_ms: *lease_ms,
                shared,
                session,
            });
        }
        (Command::Proclaim { key, .. }, ApplyResult::Proclaimed { token }) => {
            changes.push(Change::Proclaimed { key: key.clone(), token: *token })
        }
        (Command::OpenSession { .. }, ApplyResult::Granted { token, lease_ms, .. }) => {
            changes.push(Change::SessionOpened { session: *token, ttl_ms: *lease_ms })
        }
        (Command::RenewSession { session, .. }, ApplyResult::Renewed { lease_ms, .. }) => {
            changes.push(Change::SessionRenewed { session: *session, ttl_ms: *lease_ms })
        }
        _ => {}
    }
    for session in sessions_before.keys().filter(|session| !sessions_after.contains_key(session)) {
        let expired = matches!(command, Command::ExpireSession { .. });
        changes.push(Change::SessionEnded { session: *session, expired });
    }
    changes
}

/// Applies `command` with its changes and checks them against the oracle,
/// and that a session's end comes after its holders'. Returns the result.
pub(crate) fn apply_checked(table: &mut LockTable, command: Command) -> Result<ApplyResult, String> {
    let before = view(table);
    let mut changes = Vec::new();
    let result = table.apply_changes(command.clone(), &mut changes);
    let after = view(table);
    if let Some(ended) = changes.iter().position(|change| matches!(change, Change::SessionEnded { .. })) {
        if ended + 1 != changes.len() {
            return Err(format!("a session's end is not the last change: {changes:?}"));
        }
    }
    let canonical = |changes: &[Change]| {
        let mut listed: Vec<String> = changes.iter().map(|change| format!("{change:?}")).collect();
        listed.sort();
        listed
    };
    let wanted = expected(&before, &after, &command, &result);
    if canonical(&changes) != canonical(&wanted) {
        return Err(format!(
            "{command:?} answered {result:?} reported {changes:?}, the table's difference says {wanted:?}"
        ));
    }
    Ok(result)
}

#[cfg(test)]
mod examples {
    use super::*;
    use fencelock_types::Share;

    fn key(name: &str) -> Key {
        Key::new(name.as_bytes().to_vec()).unwrap()
    }

    fn owner(name: &str) -> Owner {
        Owner::new(name.as_bytes().to_vec()).unwrap()
    }

    fn lease(ms: u64) -> LeaseMs {
        LeaseMs::new(ms).unwrap()
    }

    fn apply(table: &mut LockTable, command: Command) -> (ApplyResult, Vec<Change>) {
        let mut changes = Vec::new();
        let result = table.apply_changes(command, &mut changes);
        (result, changes)
    }

    fn open_session(table: &mut LockTable) -> FencingToken {
        match apply_checked(table, Command::OpenSession { owner: owner("o"), ttl_ms: lease(1_000) }).unwrap()
        {
            ApplyResult::Granted { token, .. } => token,
            other => panic!("{other:?}"),
        }
    }

    fn permit(table: &mut LockTable, name: &str) -> FencingToken {
        let grant = Command::GrantShared {
            key: key("sem"),
            lease_ms: lease(1_000),
            owner: owner(name),
            share: Share::Permit(3),
            session: None,
        };
        match apply_checked(table, grant).unwrap() {
            ApplyResult::Granted { token, .. } => token,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_force_release_of_a_semaphore_lifts_a_held_back_permit_and_releases_a_live_one_in_token_order() {
        let mut table = LockTable::new();
        let first = permit(&mut table, "a");
        let second = permit(&mut table, "b");
        let delay = Some(lease(500));
        apply_checked(&mut table, Command::Expire { key: key("sem"), token: first, delay }).unwrap();
        let (_, changes) = apply(&mut table, Command::Release { key: key("sem"), token: None, user: None });
        let none = Value::none();
        assert_eq!(
            changes,
            [
                Change::DelayLifted {
                    key: key("sem"),
                    token: first,
                    shared: true,
                    forced: true,
                    owner: owner("a"),
                    value: none.clone()
                },
                Change::Released {
                    key: key("sem"),
                    token: second,
                    shared: true,
                    forced: true,
                    owner: owner("b"),
                    value: none
                },
            ]
        );
    }

    #[test]
    fn an_expired_session_holds_back_the_key_a_rule_covers_expires_the_other_then_ends() {
        let mut table = LockTable::new();
        let session = open_session(&mut table);
        let mut tokens = Vec::new();
        for name in ["held/a", "free/b"] {
            let grant = Command::Grant {
                key: key(name),
                lease_ms: lease(1_000),
                owner: owner("o"),
                value: Value::none(),
                session: Some(session),
            };
            match apply_checked(&mut table, grant).unwrap() {
                ApplyResult::Granted { token, .. } => tokens.push(token),
                other => panic!("{other:?}"),
            }
        }
        let delays = vec![(b"held/".to_vec(), lease(700))];
        let (_, changes) = apply(&mut table, Command::ExpireSession { session, delays });
        assert_eq!(changes.len(), 3, "{changes:?}");
        assert!(changes.contains(&Change::Delayed {
            key: key("held/a"),
            token: tokens[0],
            shared: false,
            delay_ms: lease(700)
        }));
        assert!(changes.contains(&Change::Expired {
            key: key("free/b"),
            token: tokens[1],
            shared: false,
            owner: owner("o"),
            value: Value::none()
        }));
        assert_eq!(changes[2], Change::SessionEnded { session, expired: true });
    }

    #[test]
    fn a_closed_session_releases_what_it_held_and_a_repeated_or_stale_expire_changes_nothing() {
        let mut table = LockTable::new();
        let session = open_session(&mut table);
        let grant = Command::Grant {
            key: key("k"),
            lease_ms: lease(1_000),
            owner: owner("o"),
            value: Value::none(),
            session: Some(session),
        };
        let token = match apply_checked(&mut table, grant).unwrap() {
            ApplyResult::Granted { token, .. } => token,
            other => panic!("{other:?}"),
        };
        let (_, changes) = apply(&mut table, Command::CloseSession { session, user: None });
        assert_eq!(
            changes,
            [
                Change::Released {
                    key: key("k"),
                    token,
                    shared: false,
                    forced: false,
                    owner: owner("o"),
                    value: Value::none()
                },
                Change::SessionEnded { session, expired: false },
            ]
        );
        // A stale Expire (the holder is gone), and the repeat of an Expire
        // that held a lock back, report nothing.
        let (_, changes) = apply(&mut table, Command::Expire { key: key("k"), token, delay: None });
        assert!(changes.is_empty(), "{changes:?}");
        let plain = Command::Grant {
            key: key("p"),
            lease_ms: lease(1_000),
            owner: owner("o"),
            value: Value::none(),
            session: None,
        };
        let token = match apply_checked(&mut table, plain).unwrap() {
            ApplyResult::Granted { token, .. } => token,
            other => panic!("{other:?}"),
        };
        let hold_back = Command::Expire { key: key("p"), token, delay: Some(lease(500)) };
        apply_checked(&mut table, hold_back.clone()).unwrap();
        let (_, changes) = apply(&mut table, hold_back);
        assert!(changes.is_empty(), "{changes:?}");
    }

    #[test]
    fn the_oracle_refuses_a_change_list_that_misses_one() {
        // The check itself can fail: a difference with no change reported.
        let mut table = LockTable::new();
        let before = view(&table);
        let grant = Command::Grant {
            key: key("k"),
            lease_ms: lease(1_000),
            owner: owner("o"),
            value: Value::none(),
            session: None,
        };
        let result = table.apply(grant.clone());
        let wanted = expected(&before, &view(&table), &grant, &result);
        assert_eq!(wanted.len(), 1, "{wanted:?}");
        assert_ne!(wanted, Vec::<Change>::new());
    }
}
