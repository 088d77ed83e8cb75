//! Tests of the answers as responses: each operation's outcomes, with the
//! codes and fields the protocol gives them.

use fencelock_raft::answer::{Acquired, Proclaimed, Released, Renewal};
use fencelock_raft::RequestError;
use fencelock_types::client_pb::{self as proto, Response_oneof_kind as Out};
use fencelock_types::{FencingToken, Key, LeaseMs};

use super::*;

fn key(name: &str) -> Key {
    Key::new(name.as_bytes().to_vec()).unwrap()
}

fn token(n: u64) -> FencingToken {
    FencingToken::new(n).unwrap()
}

fn lease(ms: u64) -> LeaseMs {
    LeaseMs::new(ms).unwrap()
}

#[test]
fn an_acquire_held_at_apply_or_before_reads_the_same_and_a_delay_says_so() {
    let at_apply = acquired(&key("k"), Ok(Acquired::Held { holder_token: token(4) }));
    let before = acquired(&key("k"), Err(RequestError::Held { key: key("k"), holder_token: token(4) }));
    for answer in [at_apply, before] {
        match answer {
            Ok(Out::acquire(answer)) => {
                assert_eq!(
                    (answer.outcome, answer.holder_token, answer.token),
                    (proto::AcquireOutcome::HELD, 4, 0)
                )
            }
            _ => panic!("not held"),
        }
    }
    let delayed = Err(RequestError::Delayed { key: key("k"), holder_token: token(4), left_ms: Some(900) });
    match acquired(&key("k"), delayed) {
        Ok(Out::acquire(answer)) => assert!(answer.delayed && answer.delay_left_ms == 900),
        _ => panic!("not delayed"),
    }
    match acquired(
        &key("k"),
        Ok(Acquired::Granted { token: token(9), lease_ms: lease(2_000), existing: true }),
    ) {
        Ok(Out::acquire(answer)) => assert_eq!(
            (answer.outcome, answer.token, answer.lease_ms, answer.existing),
            (proto::AcquireOutcome::GRANTED, 9, 2_000, true)
        ),
        _ => panic!("not granted"),
    }
}

#[test]
fn refusals_decided_at_apply_keep_their_codes() {
    assert!(
        matches!(acquired(&key("k"), Ok(Acquired::Mismatch { permits: 3 })), Err(Failure::Invalid(m)) if m.contains("semaphore of 3"))
    );
    assert!(
        matches!(acquired(&key("k"), Ok(Acquired::Mismatch { permits: 0 })), Err(Failure::Invalid(m)) if m.contains("read-write"))
    );
    assert!(matches!(
        acquired(&key("k"), Ok(Acquired::NoSession { session: token(5) })),
        Err(Failure::NoSession(_))
    ));
    assert!(matches!(
        acquired(&key("k"), Ok(Acquired::NotSessionOwner { session: token(5) })),
        Err(Failure::Denied(_))
    ));
    assert!(
        matches!(released(&key("k"), Released::NotYours { token: token(2) }), Err(Failure::Denied(m)) if m.contains("k (token 2)"))
    );
    assert!(matches!(proclaimed(&key("k"), token(2), Proclaimed::SharedHolder), Err(Failure::Invalid(_))));
    assert!(matches!(
        acquired(&key("k"), Err(RequestError::Dropped)),
        Err(Failure::Driver(RequestError::Dropped))
    ));
}

#[test]
fn a_renewal_answers_each_lock_asked_and_refuses_all_if_one_is_anothers() {
    let asked = vec![(key("a"), token(1)), (key("b"), token(2))];
    let renewals = vec![
        Renewal::Renewed { token: token(1), lease_ms: lease(3_000) },
        Renewal::NotHeld { holder_token: Some(token(7)) },
    ];
    match renewed(asked.clone(), lease(3_000), renewals) {
        Ok(Out::renew(answer)) => {
            let results: Vec<(Vec<u8>, u64, bool, u64)> = answer
                .results
                .iter()
                .map(|result| (result.key.clone(), result.token, result.renewed, result.holder_token))
                .collect();
            assert_eq!(results, [(b"a".to_vec(), 1, true, 0), (b"b".to_vec(), 2, false, 7)]);
            let leases: Vec<u64> = answer.results.iter().map(|result| result.lease_ms).collect();
            assert_eq!(leases, [3_000, 0]);
            assert_eq!(answer.lease_ms, 3_000);
        }
        _ => panic!("not renewed"),
    }
    // The lease in force, not the one asked: a lock under a session has
    // the session's TTL (here shorter), a longer lease kept is reported too.
    let renewals = vec![
        Renewal::Renewed { token: token(1), lease_ms: lease(9_000) },
        Renewal::Renewed { token: token(2), lease_ms: lease(1_500) },
    ];
    match renewed(asked.clone(), lease(3_000), renewals) {
        Ok(Out::renew(answer)) => {
            let leases: Vec<u64> = answer.results.iter().map(|result| result.lease_ms).collect();
            assert_eq!(leases, [9_000, 1_500]);
            assert_eq!(answer.lease_ms, 1_500, "the shortest lease in force");
        }
        _ => panic!("not renewed"),
    }
    // Nothing renewed: the lease asked.
    let renewals =
        vec![Renewal::NotHeld { holder_token: None }, Renewal::NotHeld { holder_token: Some(token(5)) }];
    match renewed(asked.clone(), lease(3_000), renewals) {
        Ok(Out::renew(answer)) => assert_eq!(answer.lease_ms, 3_000),
        _ => panic!("not answered"),
    }
    let renewals = vec![
        Renewal::Renewed { token: token(1), lease_ms: lease(3_000) },
        Renewal::NotYours { token: token(2) },
    ];
    assert!(
        matches!(renewed(asked, lease(3_000), renewals), Err(Failure::Denied(m)) if m.contains("b (token 2)"))
    );
}

#[test]
fn a_proclaim_of_a_lock_gone_names_the_token_asked_and_the_holder() {
    match proclaimed(&key("k"), token(3), Proclaimed::NotHeld { holder_token: Some(token(8)) }) {
        Ok(Out::proclaim(answer)) => {
            assert_eq!((answer.proclaimed, answer.token, answer.holder_token), (false, 3, 8))
        }
        _ => panic!("not answered"),
    }
}

#[test]
fn another_users_session_is_answered_as_one_not_open() {
    let found = |out: Out| match out {
        Out::session(answer) => (answer.session, answer.found, answer.ttl_ms),
        _ => panic!("not a session answer"),
    };
    assert_eq!(found(session_kept(token(5), SessionKept::Kept { ttl_ms: lease(4_000) })), (5, true, 4_000));
    let not_open = found(session_kept(token(5), SessionKept::NotOpen));
    assert_eq!(not_open, (5, false, 0));
    assert_eq!(found(session_kept(token(5), SessionKept::NotYours)), not_open, "a keep-alive tells");
    assert_eq!(found(session_closed(token(5), SessionClosed::Closed)), (5, true, 0));
    let not_open = found(session_closed(token(5), SessionClosed::NotOpen));
    assert_eq!(found(session_closed(token(5), SessionClosed::NotYours)), not_open, "a close tells");
}

#[test]
fn a_session_answer_is_found_with_its_ttl_or_not_found() {
    match session_answer(token(5), Some(0)) {
        Out::session(answer) => assert_eq!((answer.session, answer.found, answer.ttl_ms), (5, true, 0)),
        _ => panic!("not a session answer"),
    }
    match session_answer(token(5), None) {
        Out::session(answer) => assert!(!answer.found),
        _ => panic!("not a session answer"),
    }
}
