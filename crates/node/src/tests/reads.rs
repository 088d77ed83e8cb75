//! Reads and watches: a deposed leader never answers a read from its
//! stale table, and watches on followers follow the log.

use super::*;

#[test]
fn a_deposed_leader_cut_off_from_the_others_never_answers_a_read_from_its_stale_table() {
    // Node 1 leads and grants "a"; then it is cut off, the others elect a
    // leader of their own and release "a". Node 1 still believes it leads.
    // A linearizable read it takes must not answer from its table (which
    // still says "a" is held): through ReadIndex it waits for a quorum that
    // never answers.
    let mut net = Net::with_config(3, |config| {
        config.raft.election_ticks = 10;
        config.raft.election_ticks_max = Some(1_000);
    });
    net.elect(1);
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    net.settle();
    let token = applied_token(net.take_reply(RequestId(1)));
    net.down.insert(1);
    // Nodes 2 and 3 stop hearing from node 1. Node 2 times out first and
    // node 3, past the leader's lease but not yet timed out, votes for it.
    net.node(2).pin_election_timeout(50);
    net.node(3).pin_election_timeout(999);
    for _ in 0..60 {
        net.node(2).tick();
        net.node(3).tick();
    }
    net.until_quiet();
    let leader = 2;
    assert!(net.node(leader).is_leader_ready(), "{:?}", net.node(leader).status());
    net.node(leader)
        .propose(RequestId(2), vec![Command::Release { key: key("a"), token: Some(token), user: None }]);
    net.settle();
    assert!(net.node(leader).table().holder(b"a").is_none());
    assert_eq!(net.node(1).status().role, crate::Role::Leader, "node 1 no longer believes it leads");
    net.node(1).read(RequestId(3), crate::Query::Holder(key("a")));
    net.settle();
    match net.take_reply(RequestId(3)) {
        None | Some(Err(_)) => {}
        Some(Ok(answer)) => {
            panic!("a deposed leader answered a linearizable read from its own table: {answer:?}")
        }
    }
}

/// A watch's answer, or a failure naming what came instead.
fn watch_answer(reply: Option<crate::Reply>) -> crate::watch::WatchAnswer {
    match reply {
        Some(Ok(Response::Watch(answer))) => answer,
        other => panic!("a watch answered {other:?}"),
    }
}

#[test]
fn watches_on_followers_follow_the_log_across_a_leader_change_and_a_snapshot_install() {
    use crate::registry::ConnId;
    use crate::watch::{WatchKind, WatchQuery};
    let watch =
        |after: Option<u64>, wait_ms: u64| WatchQuery { prefix: b"e/".to_vec(), after, wait_ms, limit: 100 };
    let mut net = Net::with_config(3, |config| config.raft.snapshot_interval_entries = 5);
    net.elect(1);
    // A start, on a follower: no holders yet, and the index to go on from.
    net.node(2).watch(RequestId(10), ConnId(1), watch(None, 0));
    net.settle();
    let start = watch_answer(net.take_reply(RequestId(10)));
    assert_eq!(start.current, Some(Vec::new()));
    // Parked on both followers until a change under the prefix applies.
    net.node(2).watch(RequestId(11), ConnId(1), watch(Some(start.index), 60_000));
    net.node(3).watch(RequestId(12), ConnId(1), watch(Some(start.index), 60_000));
    net.node(1).propose(RequestId(1), vec![grant("other", "o1")]);
    net.settle();
    assert!(net.take_reply(RequestId(11)).is_none(), "a change outside the prefix answered a watch");
    net.node(1).propose(RequestId(2), vec![grant("e/1", "o1")]);
    net.settle();
    let token = applied_token(net.take_reply(RequestId(2)));
    for id in [11, 12] {
        let answer = watch_answer(net.take_reply(RequestId(id)));
        assert_eq!(answer.events.len(), 1, "{answer:?}");
        let event = &answer.events[0];
        assert_eq!((event.kind, event.token, event.key.as_bytes()), (WatchKind::Granted, token, &b"e/1"[..]));
        assert_eq!(answer.index, event.index);
    }
    let seen = net.node(2).status().log.applied_index;
    // Leadership moves; a watch parked on the old leader (now a follower)
    // is answered by what the new leader commits.
    net.node(1).watch(RequestId(13), ConnId(2), watch(Some(seen), 60_000));
    net.elect(2);
    net.node(2).propose(
        RequestId(3),
        vec![Command::Proclaim {
            key: key("e/1"),
            token,
            value: fencelock_types::Value::new(b"v2".to_vec()).unwrap(),
            user: None,
        }],
    );
    net.settle();
    let answer = watch_answer(net.take_reply(RequestId(13)));
    assert_eq!(answer.events.iter().map(|event| event.kind).collect::<Vec<_>>(), [WatchKind::Proclaimed]);
    assert_eq!(answer.events[0].value.as_bytes(), b"v2");
    // Node 3 misses many entries and catches up from a snapshot: it cannot
    // tell what happened before it, so an old position is answered
    // compacted, with the holders now; a new one gets the changes.
    net.down.insert(3);
    for n in 0..12u64 {
        net.node(2).propose(RequestId(100 + n), vec![grant(&format!("e/x{n}"), "o2")]);
        net.settle();
    }
    net.down.remove(&3);
    net.settle();
    assert!(net.node(3).status().log.snapshot_index > seen, "{:?}", net.node(3).status());
    // It told its shell to rebuild from the table (what the lease timer
    // and the server's metrics follow), at the snapshot's index.
    let restored = net.node(3).status().log.snapshot_index;
    assert!(
        net.applied
            .iter()
            .any(|(node, index, event)| (*node, *index, event)
                == (3, restored, &crate::AppliedEvent::Restored)),
        "node 3 installed a snapshot without saying so"
    );
    net.node(3).watch(RequestId(14), ConnId(3), watch(Some(seen), 0));
    net.settle();
    let answer = watch_answer(net.take_reply(RequestId(14)));
    assert!(answer.compacted && answer.events.is_empty(), "{answer:?}");
    assert_eq!(answer.current.as_ref().map(Vec::len), Some(13));
    let caught_up = answer.index;
    net.node(3).watch(RequestId(15), ConnId(3), watch(Some(caught_up), 60_000));
    net.node(2)
        .propose(RequestId(4), vec![Command::Release { key: key("e/1"), token: Some(token), user: None }]);
    net.settle();
    let answer = watch_answer(net.take_reply(RequestId(15)));
    assert_eq!(answer.events.iter().map(|event| event.kind).collect::<Vec<_>>(), [WatchKind::Released]);
    assert!(answer.index > caught_up);
    // A closed connection's parked watch is forgotten.
    net.node(3).watch(RequestId(16), ConnId(3), watch(Some(answer.index), 60_000));
    assert!(net.node(3).cancel(RequestId(16)));
    net.node(2).propose(RequestId(5), vec![grant("e/2", "o1")]);
    net.settle();
    assert!(net.take_reply(RequestId(16)).is_none());
}
