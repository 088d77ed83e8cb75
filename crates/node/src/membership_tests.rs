//! Membership changes on replicas joined by hand-passed messages: a node
//! joins as a learner, is promoted, the leader is removed, and tokens
//! carry on unique and increasing throughout.

use super::*;
use crate::log::MemStore;
use crate::{Member, MemberChange, MemberRole, RequestError};

impl Net<MemStore> {
    /// Adds replica `id` (the next one) on a blank store, joining: it takes
    /// messages from `members` until it learns the configuration.
    fn join(&mut self, id: u64, members: &[u64]) {
        assert_eq!(id as usize, self.replicas.len() + 1);
        let mut config = test_config(id, 0);
        config.voters = members.iter().copied().map(NodeId).collect();
        config.founding.joining = true;
        let store = MemStore::new();
        let replica = Replica::open(config, store.clone().recover().unwrap(), &logger()).unwrap();
        self.replicas.push(replica);
        self.stores.push(store);
    }

    fn leader(&mut self) -> u64 {
        let live: Vec<&Replica> = self
            .replicas
            .iter()
            .enumerate()
            .filter(|(at, _)| !self.down.contains(&(*at as u64 + 1)))
            .map(|(_, replica)| replica)
            .collect();
        live.iter()
            .find(|replica| replica.is_leader_ready())
            .map(|replica| replica.status().id.0)
            .unwrap_or(0)
    }

    /// Asks the leader for `change`; returns its answer after settling.
    fn change(&mut self, request: u64, change: MemberChange) -> crate::Reply {
        let leader = self.leader();
        self.node(leader).change_members(RequestId(request), change);
        self.settle();
        self.take_reply(RequestId(request)).expect("the change is answered")
    }

    /// Grants `key` on the leader and returns its token.
    fn grant_token(&mut self, request: u64, key_name: &str) -> FencingToken {
        let leader = self.leader();
        self.node(leader).propose(RequestId(request), vec![grant(key_name, "o1")]);
        self.settle();
        applied_token(self.take_reply(RequestId(request)))
    }
}

fn roles(reply: &crate::Reply) -> Vec<(u64, MemberRole)> {
    match reply {
        Ok(Response::Members { members, .. }) => {
            members.iter().map(|member| (member.id.0, member.role)).collect()
        }
        other => panic!("not a membership: {other:?}"),
    }
}

fn learner(id: u64) -> MemberChange {
    let addrs = |id: u64| fencelock_fsm::MemberAddrs {
        peer_addr: format!("n{id}:7001"),
        client_addr: format!("n{id}:7101"),
    };
    MemberChange::AddLearner {
        id: NodeId(id),
        peer_addr: format!("n{id}:7001"),
        client_addr: format!("n{id}:7101"),
        known: (1..=3).map(|other| (NodeId(other), addrs(other))).collect(),
    }
}

#[test]
fn a_node_joins_as_a_learner_is_promoted_and_the_leader_is_replaced_with_tokens_increasing() {
    let mut net = Net::new(3);
    net.elect(1);
    let mut tokens = vec![net.grant_token(1, "before")];

    net.join(4, &[1, 2, 3]);
    let added = net.change(10, learner(4));
    assert_eq!(
        roles(&added),
        vec![
            (1, MemberRole::Voter),
            (2, MemberRole::Voter),
            (3, MemberRole::Voter),
            (4, MemberRole::Learner)
        ]
    );
    // Every replica, the learner included, records where 4 is reached.
    for id in 1..=4 {
        let addrs = net.node(id).table().member(4).cloned().expect("the directory names node 4");
        assert_eq!(addrs.peer_addr, "n4:7001");
        // And the initial members, as the leader knew them.
        let first = net.node(id).table().member(1).cloned().expect("the directory names node 1");
        assert_eq!(first.client_addr, "n1:7101");
    }
    tokens.push(net.grant_token(2, "learning"));
    assert_eq!(net.replicas[3].table(), net.replicas[0].table(), "the learner caught up");
    // A retry of the add is answered as done; the same id at other
    // addresses is refused.
    assert_eq!(roles(&net.change(11, learner(4))), roles(&added));
    let moved = MemberChange::AddLearner {
        id: NodeId(4),
        peer_addr: "x:1".into(),
        client_addr: "x:2".into(),
        known: vec![],
    };
    assert!(matches!(net.change(12, moved), Err(RequestError::BadMemberChange(_))));

    let promoted = net.change(13, MemberChange::Promote(NodeId(4)));
    assert_eq!(roles(&promoted).last(), Some(&(4, MemberRole::Voter)));
    tokens.push(net.grant_token(3, "four-voters"));

    // Removing the leader hands leadership over first; the retry at the
    // new leader removes it, and the removed node stops.
    let leader = net.leader();
    net.node(leader).change_members(RequestId(14), MemberChange::Remove(NodeId(leader)));
    net.settle();
    let hint = match net.take_reply(RequestId(14)) {
        Some(Err(RequestError::NotLeader { leader_hint: Some(hint) })) => hint,
        other => panic!("removing the leader: {other:?}"),
    };
    assert_ne!(hint.0, leader);
    assert_eq!(net.leader(), hint.0, "leadership moved to the hinted voter");
    let removed = net.change(15, MemberChange::Remove(NodeId(leader)));
    assert!(!roles(&removed).iter().any(|(id, _)| *id == leader), "{removed:?}");
    assert!(
        net.stopped.iter().any(|(id, err)| *id == leader && matches!(err, FatalError::Removed { .. })),
        "the removed node stops: {:?}",
        net.stopped
    );
    // A removed node's store does not serve again: it stops at open, or
    // at its first turn, when it applies its removal again.
    let store = net.stores[(leader - 1) as usize].clone().recover().unwrap();
    match Replica::open(test_config(leader, 3), store, &logger()) {
        Err(FatalError::Removed { .. }) => {}
        Ok(mut reopened) => {
            assert!(
                matches!(reopened.run_ready(), Err(FatalError::Removed { .. })),
                "{:?}",
                reopened.status()
            )
        }
        Err(other) => panic!("{other}"),
    }
    // A retry of the removal is answered as done.
    assert_eq!(roles(&net.change(16, MemberChange::Remove(NodeId(leader)))), roles(&removed));

    tokens.push(net.grant_token(4, "after"));
    assert!(tokens.windows(2).all(|pair| pair[0] < pair[1]), "tokens went backwards: {tokens:?}");
    let survivors: Vec<u64> = (1..=4).filter(|id| *id != leader).collect();
    let table = net.node(survivors[0]).table().clone();
    for id in &survivors[1..] {
        assert_eq!(net.node(*id).table(), &table, "node {id} differs");
    }
    let members: Vec<Member> = net.node(survivors[0]).members();
    assert_eq!(members.iter().map(|member| member.id.0).collect::<Vec<_>>(), survivors);
}

#[test]
fn one_change_at_a_time_and_a_learner_is_promoted_only_once_caught_up() {
    let mut net = Net::new(3);
    net.elect(1);
    net.join(4, &[1, 2, 3]);
    net.join(5, &[1, 2, 3]);
    // Two changes asked together: the second waits for the first.
    net.node(1).change_members(RequestId(1), learner(4));
    net.node(1).change_members(RequestId(2), learner(5));
    net.settle();
    assert!(matches!(net.take_reply(RequestId(1)), Some(Ok(Response::Members { .. }))));
    assert!(matches!(net.take_reply(RequestId(2)), Some(Err(RequestError::MemberChangeBusy(_)))));

    // Learner 5 hears nothing: it cannot catch up, and is not promoted.
    net.down.insert(5);
    assert!(matches!(net.change(3, learner(5)), Ok(Response::Members { .. })));
    for request in 0..5 {
        net.grant_token(100 + request, &format!("k{request}"));
    }
    let refused = net.change(4, MemberChange::Promote(NodeId(5)));
    assert!(
        matches!(&refused, Err(RequestError::MemberChangeBusy(why)) if why.contains("caught up")),
        "{refused:?}"
    );
    // Once it hears the leader again, it catches up and is promoted.
    net.down.remove(&5);
    net.settle();
    assert_eq!(roles(&net.change(5, MemberChange::Promote(NodeId(5)))).last(), Some(&(5, MemberRole::Voter)));
    assert_eq!(net.replicas[4].table(), net.replicas[0].table());

    // Nonsense: node 0, promoting a stranger, removing the last voter.
    assert!(matches!(net.change(6, learner(0)), Err(RequestError::BadMemberChange(_))));
    assert!(matches!(net.change(7, MemberChange::Promote(NodeId(9))), Err(RequestError::BadMemberChange(_))));
    // A follower refuses with a hint.
    net.node(2).change_members(RequestId(8), learner(6));
    net.settle();
    assert!(matches!(
        net.take_reply(RequestId(8)),
        Some(Err(RequestError::NotLeader { leader_hint: Some(NodeId(1)) }))
    ));
}

#[test]
fn a_leadership_transfer_is_answered_once_the_target_leads() {
    let mut net = Net::new(3);
    net.elect(1);
    net.node(1).transfer(RequestId(1), NodeId(3));
    net.settle();
    assert_eq!(net.take_reply(RequestId(1)), Some(Ok(Response::Transferred { leader: NodeId(3) })));
    assert_eq!(net.leader(), 3);
    // To a stranger: refused at once.
    net.node(3).transfer(RequestId(2), NodeId(7));
    net.settle();
    assert!(matches!(net.take_reply(RequestId(2)), Some(Err(RequestError::BadMemberChange(_)))));
    // Asked of a follower: a hint.
    net.node(2).transfer(RequestId(3), NodeId(2));
    net.settle();
    assert!(matches!(net.take_reply(RequestId(3)), Some(Err(RequestError::NotLeader { .. }))));
}

#[test]
fn a_joining_node_takes_messages_only_from_the_members_it_was_told() {
    let mut net = Net::new(3);
    net.elect(1);
    net.join(4, &[1, 2, 3]);
    // An answer from a node outside the members it was told (a heartbeat
    // or a vote request would pass: a member of a configuration it has not
    // applied yet).
    let mut forged = Message::default();
    forged.set_msg_type(MessageType::MsgHeartbeatResponse);
    forged.from = 9;
    forged.to = 4;
    forged.term = 5;
    let before = net.node(4).stats().refused.total();
    net.node(4).step(forged);
    assert_eq!(net.node(4).stats().refused.total(), before + 1);
    assert!(matches!(net.change(1, learner(4)), Ok(Response::Members { .. })));
    net.settle();
    assert_eq!(net.node(4).status().conf.voters, vec![1, 2, 3], "the learner learnt the configuration");
}

/// Found by the simulator with membership changes on (seed 7814 of 3
/// nodes): a leader paused long enough to be deposed, back and still
/// thinking it leads, answered a promotion of the learner the new leader
/// had added with "not a member; add it first", from its old
/// configuration. Answers that do not go through the log wait for a
/// ReadIndex that shows the node still leads.
#[test]
fn a_deposed_leader_answers_no_membership_request_from_its_old_configuration() {
    // Election timeouts of 10 to 40 ticks, so that nodes 2 and 3 elect.
    let stores = vec![MemStore::new(), MemStore::new(), MemStore::new()];
    let mut net = Net::build(stores, |config| {
        config.raft.election_ticks = 10;
        config.raft.election_ticks_max = Some(40);
    });
    net.elect(1);
    // Node 1 is cut off (and node 4 never runs: its messages go nowhere).
    net.down.insert(1);
    net.down.insert(4);
    let mut rounds = 0;
    let leader = loop {
        if let Some(ready) = [2, 3].into_iter().find(|id| net.node(*id).is_leader_ready()) {
            break ready;
        }
        rounds += 1;
        assert!(rounds < 5_000, "nodes 2 and 3 elected no one: {:?}", net.node(2).status());
        net.until_quiet();
        net.node(2).tick();
        net.node(3).tick();
    };
    net.node(leader).change_members(RequestId(7), learner(4));
    for _ in 0..5 {
        net.until_quiet();
        net.node(2).tick();
        net.node(3).tick();
    }
    assert!(matches!(net.take_reply(RequestId(7)), Some(Ok(Response::Members { .. }))));
    assert_eq!(net.node(1).status().role, crate::Role::Leader, "node 1 should not know it was deposed");
    // Back: asked at once, before it hears of the new term.
    net.down.remove(&1);
    net.node(1).change_members(RequestId(8), MemberChange::Promote(NodeId(4)));
    net.until_quiet();
    let reply = net.take_reply(RequestId(8));
    assert!(
        !matches!(reply, Some(Err(RequestError::BadMemberChange(_)))),
        "the deposed leader answered from its old configuration: {reply:?}"
    );
    assert!(matches!(reply, Some(Err(RequestError::NotLeader { .. }))), "{reply:?}");
}
