//! The leader's proposals: nothing before its own-term entry applies, one
//! command per key in flight, a held key answered without a log entry,
//! followers' refusals, renewals batched in one entry, and tokens that
//! never repeat across leader changes.

use super::*;

#[test]
fn a_new_leader_proposes_nothing_before_it_applies_an_entry_of_its_own_term() {
    let mut net = Net::new(3);
    // Votes arrive, append acknowledgements to node 2 do not: elected, but
    // its own-term entry cannot commit.
    net.blocked.insert((2, MessageType::MsgAppendResponse as i32));
    net.node(2).campaign().unwrap();
    net.settle();
    let status = net.node(2).status();
    assert_eq!(status.role, crate::Role::Leader);
    assert!(!status.leader_ready);
    let last_index = status.log.last_index;

    net.node(2).propose(RequestId(1), vec![grant("a", "o1")]);
    for _ in 0..5 {
        net.turn().unwrap();
    }
    assert_eq!(net.node(2).status().log.last_index, last_index, "proposed before the own-term barrier");
    assert_eq!(net.node(2).stats().commands_proposed, 0);
    assert!(net.take_reply(RequestId(1)).is_none());

    net.blocked.clear();
    net.settle();
    assert!(net.node(2).is_leader_ready());
    assert!(matches!(
        net.take_reply(RequestId(1)),
        Some(Ok(Response::Applied(results))) if matches!(results[0], ApplyResult::Granted { .. })
    ));
}

#[test]
fn an_expire_and_a_renew_of_one_lock_are_never_in_flight_together() {
    let mut net = Net::new(3);
    net.elect(1);
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    net.settle();
    let Some(Ok(Response::Applied(results))) = net.take_reply(RequestId(1)) else { panic!("no grant") };
    let ApplyResult::Granted { token, .. } = results[0] else { panic!("{results:?}") };

    let before = net.node(1).stats().commands_proposed;
    let lease_ms = LeaseMs::new(5000).unwrap();
    net.node(1).propose(RequestId(2), vec![Command::Renew { key: key("a"), token, lease_ms, user: None }]);
    net.node(1).propose(RequestId(3), vec![Command::Expire { key: key("a"), token, delay: None }]);
    // Another key is not held back.
    net.node(1).propose(RequestId(4), vec![grant("b", "o1")]);
    net.node(1).run_ready().unwrap();
    assert_eq!(net.node(1).stats().commands_proposed - before, 2, "renew and grant of b only");

    net.settle();
    assert_eq!(
        net.take_reply(RequestId(2)),
        Some(Ok(Response::Applied(vec![ApplyResult::Renewed { token, lease_ms }])))
    );
    assert_eq!(
        net.take_reply(RequestId(3)),
        Some(Ok(Response::Applied(vec![ApplyResult::Expired { existed: true }])))
    );
    assert_eq!(net.node(1).stats().commands_proposed - before, 3);
}

#[test]
fn a_grant_on_a_key_held_by_another_owner_is_answered_without_a_log_entry() {
    let mut net = Net::new(3);
    net.elect(1);
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    net.settle();
    let Some(Ok(Response::Applied(results))) = net.take_reply(RequestId(1)) else { panic!() };
    let ApplyResult::Granted { token, .. } = results[0] else { panic!() };
    let last_index = net.node(1).status().log.last_index;
    net.node(1).propose(RequestId(2), vec![grant("a", "o2")]);
    net.settle();
    assert_eq!(
        net.take_reply(RequestId(2)),
        Some(Err(RequestError::Held { key: key("a"), holder_token: token }))
    );
    assert_eq!(net.node(1).status().log.last_index, last_index);
}

#[test]
fn followers_refuse_proposals_with_a_leader_hint() {
    let mut net = Net::new(3);
    net.elect(1);
    net.node(2).propose(RequestId(9), vec![grant("a", "o1")]);
    net.turn().unwrap();
    assert_eq!(
        net.take_reply(RequestId(9)),
        Some(Err(RequestError::NotLeader { leader_hint: Some(NodeId(1)) }))
    );
}

#[test]
fn tokens_never_repeat_across_leader_changes() {
    let mut net = Net::new(3);
    let mut seen = BTreeSet::new();
    let mut request = 0;
    for round in 0..6u64 {
        let leader = round % 3 + 1;
        net.elect(leader);
        for _ in 0..5 {
            request += 1;
            net.node(leader).propose(RequestId(request), vec![grant(&format!("k{request}"), "o1")]);
        }
        net.settle();
        for id in (request - 4)..=request {
            match net.take_reply(RequestId(id)) {
                Some(Ok(Response::Applied(results))) => match results[0] {
                    ApplyResult::Granted { token, .. } => {
                        assert!(seen.insert(token), "token {token} issued twice")
                    }
                    other => panic!("{other:?}"),
                },
                other => panic!("request {id}: {other:?}"),
            }
        }
    }
    assert_eq!(seen.len(), 30);
    assert_eq!(seen.iter().next_back(), FencingToken::new(30).as_ref());
}

#[test]
fn renewals_of_many_locks_travel_in_one_entry() {
    let mut net = Net::new(3);
    net.elect(1);
    let lease_ms = LeaseMs::new(1000).unwrap();
    let mut tokens = Vec::new();
    for i in 0..5u64 {
        net.node(1).acquire(RequestId(i), key(&format!("k{i}")), lease_ms, owner("o1"), Value::none(), 0);
        net.settle();
        tokens.push(applied_token(net.take_reply(RequestId(i))));
    }
    let before = net.node(1).stats();
    let renewals = tokens
        .iter()
        .enumerate()
        .map(|(i, token)| Command::Renew { key: key(&format!("k{i}")), token: *token, lease_ms, user: None })
        .collect();
    net.node(1).propose(RequestId(100), renewals);
    net.settle();
    let after = net.node(1).stats();
    assert_eq!(after.entries_proposed - before.entries_proposed, 1);
    let expected = tokens.iter().map(|token| ApplyResult::Renewed { token: *token, lease_ms }).collect();
    assert_eq!(net.take_reply(RequestId(100)), Some(Ok(Response::Applied(expected))));
}
