//! Tests of the answers per operation: every result a client command applies
//! with is one of its operation's, and nothing else passes.

use fencelock_fsm::LockTable;
use fencelock_types::{ApplyResult, ClusterId, Command, FencingToken, Key, LeaseMs, Owner, Share, Value};
use proptest::prelude::*;

use super::*;
use crate::answer::{Acquired, Released, Renewal, SessionClosed, SessionKept};
use crate::ClientRequest;

fn key(n: u8) -> Key {
    Key::new(format!("k{n}").into_bytes()).expect("a valid key")
}

fn owner(n: u8) -> Owner {
    Owner::new(format!("o{n}").into_bytes()).expect("a valid owner")
}

fn lease(ms: u64) -> LeaseMs {
    LeaseMs::new(ms).expect("a valid lease")
}

fn token(n: u64) -> FencingToken {
    FencingToken::new(n).expect("a non-zero token")
}

/// A command as a client's request makes it (the handler's checks passed),
/// or the leader's own (an expiry), over few keys, owners and tokens so
/// that they meet.
fn command() -> impl Strategy<Value = Command> {
    let k = 0u8..3;
    let o = 0u8..3;
    let t = 1u64..12;
    let user = proptest::option::of(0u8..3);
    let session = proptest::option::of(1u64..12);
    prop_oneof![
        (k.clone(), o.clone(), session.clone()).prop_map(|(k, o, s)| Command::Grant {
            key: key(k),
            lease_ms: lease(1_000),
            owner: owner(o),
            value: Value::none(),
            session: s.map(token),
        }),
        (k.clone(), o.clone(), 0u32..4, session).prop_map(|(k, o, share, s)| Command::GrantShared {
            key: key(k),
            lease_ms: lease(1_000),
            owner: owner(o),
            share: match share {
                0 => Share::Read,
                1 => Share::Write,
                n => Share::Permit(n),
            },
            session: s.map(token),
        }),
        (k.clone(), proptest::option::of(t.clone()), user.clone()).prop_map(|(k, t, u)| Command::Release {
            key: key(k),
            token: t.map(token),
            user: u.map(owner),
        }),
        (k.clone(), t.clone(), user.clone()).prop_map(|(k, t, u)| Command::Renew {
            key: key(k),
            token: token(t),
            lease_ms: lease(2_000),
            user: u.map(owner),
        }),
        (k.clone(), t.clone(), user.clone()).prop_map(|(k, t, u)| Command::Proclaim {
            key: key(k),
            token: token(t),
            value: Value::new(b"v".to_vec()).expect("a valid value"),
            user: u.map(owner),
        }),
        o.prop_map(|o| Command::OpenSession { owner: owner(o), ttl_ms: lease(1_000) }),
        (t.clone(), user.clone())
            .prop_map(|(t, u)| Command::RenewSession { session: token(t), user: u.map(owner) }),
        (t.clone(), user).prop_map(|(t, u)| Command::CloseSession { session: token(t), user: u.map(owner) }),
        (k, t.clone()).prop_map(|(k, t)| Command::Expire { key: key(k), token: token(t), delay: None }),
        t.prop_map(|t| Command::ExpireSession { session: token(t), delays: Vec::new() }),
    ]
}

/// The kind of request that carries `command`, and `None` for the leader's
/// own commands.
fn asked_for(command: &Command) -> Option<Asked> {
    Some(match command {
        Command::Grant { .. } | Command::GrantShared { .. } => Asked::Acquire,
        Command::Release { .. } => Asked::Release,
        Command::Renew { .. } => Asked::Renew(1),
        Command::Proclaim { .. } => Asked::Proclaim,
        Command::OpenSession { .. } => Asked::OpenSession,
        Command::RenewSession { .. } => Asked::KeepAlive,
        Command::CloseSession { .. } => Asked::CloseSession,
        _ => return None,
    })
}

fn founded() -> LockTable {
    let mut table = LockTable::new();
    let bootstrap = Command::Bootstrap {
        cluster_id: ClusterId::new([7; fencelock_types::CLUSTER_ID_LEN]),
        token_floor: 0,
        level: fencelock_types::LEVEL,
    };
    table.apply(bootstrap);
    table
}

proptest! {
    /// Whatever the table holds, every result a client's command applies
    /// with is one of its operation's answers: the one place that turns
    /// the rest into an internal error never does.
    #[test]
    fn every_result_of_a_clients_command_is_an_answer_of_its_operation(
        commands in proptest::collection::vec(command(), 1..60),
    ) {
        let mut table = founded();
        for command in commands {
            let asked = asked_for(&command);
            let result = table.apply(command.clone());
            if let Some(asked) = asked {
                let answer = asked.answer(Ok(Response::Applied(vec![result])));
                prop_assert!(answer.is_ok(), "{command:?} applied with {result:?}: {answer:?}");
            }
        }
    }
}

#[test]
fn each_result_becomes_its_operations_answer() {
    let granted = ApplyResult::Granted { token: token(3), lease_ms: lease(1_000), existing: true };
    assert_eq!(
        Asked::Acquire.answer(Ok(Response::Applied(vec![granted]))),
        Ok(Response::Acquired(Acquired::Granted { token: token(3), lease_ms: lease(1_000), existing: true }))
    );
    assert_eq!(
        Asked::Release
            .answer(Ok(Response::Applied(vec![ApplyResult::NotFound { holder_token: Some(token(4)) }]))),
        Ok(Response::Released(Released::NotHeld { holder_token: Some(token(4)) }))
    );
    let renewals = vec![
        ApplyResult::Renewed { token: token(1), lease_ms: lease(900) },
        ApplyResult::Denied { token: token(2) },
    ];
    assert_eq!(
        Asked::Renew(2).answer(Ok(Response::Applied(renewals))),
        Ok(Response::Renewed(vec![
            Renewal::Renewed { token: token(1), lease_ms: lease(900) },
            Renewal::NotYours { token: token(2) },
        ]))
    );
    assert_eq!(
        Asked::KeepAlive.answer(Ok(Response::Applied(vec![ApplyResult::NoSession { session: token(5) }]))),
        Ok(Response::SessionKept(SessionKept::NotOpen))
    );
    assert_eq!(
        Asked::CloseSession.answer(Ok(Response::Applied(vec![ApplyResult::Released { token: token(5) }]))),
        Ok(Response::SessionClosed(SessionClosed::Closed))
    );
}

#[test]
fn a_result_outside_the_operation_or_a_miscount_is_an_internal_error() {
    let exhausted = ApplyResult::Invalid { reason: fencelock_types::InvalidReason::TokensExhausted };
    for asked in [Asked::Acquire, Asked::Release, Asked::Proclaim, Asked::OpenSession, Asked::KeepAlive] {
        let answer = asked.answer(Ok(Response::Applied(vec![exhausted])));
        assert!(matches!(answer, Err(RequestError::Internal(_))), "{asked:?}: {answer:?}");
    }
    // A renewal of two locks answered with one result.
    let one = vec![ApplyResult::Renewed { token: token(1), lease_ms: lease(900) }];
    assert!(matches!(Asked::Renew(2).answer(Ok(Response::Applied(one))), Err(RequestError::Internal(_))));
    // An answer of another kind than the operation's.
    assert!(matches!(Asked::Release.answer(Ok(Response::Check(true))), Err(RequestError::Internal(_))));
}

#[test]
fn errors_and_raw_results_pass_through() {
    let held = Err(RequestError::Held { key: key(1), holder_token: token(2) });
    assert_eq!(Asked::Acquire.answer(held.clone()), held);
    let raw = Ok(Response::Applied(vec![ApplyResult::Noop, ApplyResult::Expired { existed: false }]));
    assert_eq!(Asked::Raw.answer(raw.clone()), raw);
}

#[test]
fn each_request_kind_asks_for_its_answer() {
    let release = ClientRequest::Release { key: key(1), token: Some(token(1)), user: None };
    assert_eq!(release.asked(), Asked::Release);
    let renew = ClientRequest::Renew {
        locks: vec![(key(1), token(1)), (key(2), token(2))],
        lease_ms: lease(1_000),
        user: None,
    };
    assert_eq!(renew.asked(), Asked::Renew(2));
    assert_eq!(ClientRequest::Read(crate::Query::Members).asked(), Asked::Answered);
}

#[test]
fn an_answer_of_another_operation_is_an_internal_error_for_the_asker() {
    let released = Ok(Response::Released(Released::Released { token: token(1) }));
    assert_eq!(Released::of(released.clone()), Ok(Released::Released { token: token(1) }));
    assert!(matches!(Acquired::of(released), Err(RequestError::Internal(_))));
    let failed = Err(RequestError::Dropped);
    assert_eq!(Acquired::of(failed), Err(RequestError::Dropped));
    assert_eq!(Holding::of(Ok(Response::Holders(Vec::new()))), Ok(Holding::Shared(Vec::new())));
}
