//! Storage and restarts: a failing disk, an asynchronous store whose
//! writes count only once durable, reports of durable writes, and a
//! replica reopened on its store.

use super::*;

#[test]
fn a_storage_failure_is_fatal_and_acknowledges_nothing_unpersisted() {
    let store = FailingStore::default();
    let failing = Arc::clone(&store.failing);
    let mut net = Net::with_stores(vec![store]);
    net.elect(1);
    failing.store(true, Ordering::SeqCst);
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    // The shell's write fails (the node asked for it and holds the answer).
    let result = net.turn();
    assert!(matches!(result, Err(FatalError::Storage(_))), "{result:?}");
    assert!(net.take_reply(RequestId(1)).is_none(), "answered a grant whose write failed");
    assert!(net.node(1).writes_in_flight() > 0);
}

#[test]
fn a_replica_reopened_on_its_store_rebuilds_the_same_table() {
    let stores: Vec<MemStore> = (0..3).map(|_| MemStore::new()).collect();
    let mut net = Net::with_stores(stores.clone());
    net.elect(1);
    for i in 0..20u64 {
        net.node(1).propose(RequestId(i), vec![grant(&format!("k{i}"), "o1")]);
    }
    net.settle();
    let before = net.node(1).table().snapshot();
    let last_token = net.node(1).table().last_token();
    drop(net);
    let net = Net::with_stores(stores);
    for replica in &net.replicas {
        // Entries after the last snapshot are applied again once the node
        // learns the commit index; the snapshot alone gives what was compacted.
        assert!(replica.table().last_token() <= last_token);
    }
    let mut net = net;
    net.elect(2);
    for replica in &net.replicas {
        assert_eq!(replica.table().snapshot(), before);
    }
}

#[test]
fn with_an_asynchronous_store_nothing_counts_before_its_write_is_durable() {
    let stores: Vec<QueuedStore> = (0..3).map(|_| QueuedStore::default()).collect();
    let mut net = Net::with_stores(stores.clone());
    // Votes are held until their node's hard state is durable.
    net.node(1).campaign().unwrap();
    turns_persisting(&mut net, &stores, &[1], 20);
    assert_ne!(net.node(1).status().role, crate::Role::Leader, "elected on votes not yet durable");
    turns_persisting(&mut net, &stores, &[1, 2, 3], 20);
    assert!(net.node(1).is_leader_ready());

    // Only the leader's disk syncs: its entry is not committed by a quorum.
    let commit = net.node(1).status().log.commit_index;
    net.node(1).propose(RequestId(1), vec![grant("a", "o1")]);
    turns_persisting(&mut net, &stores, &[1], 20);
    assert_eq!(
        net.node(1).status().log.commit_index,
        commit,
        "committed on acknowledgements not yet durable"
    );
    assert!(net.take_reply(RequestId(1)).is_none());

    // The followers' disks sync: a quorum has it, but the leader answers
    // only once its own copy is durable too.
    net.node(1).propose(RequestId(2), vec![grant("b", "o1")]);
    turns_persisting(&mut net, &stores, &[2, 3], 20);
    assert!(net.node(1).status().log.commit_index > commit);
    assert!(net.take_reply(RequestId(2)).is_none(), "answered before the leader's own write was durable");
    assert!(net.node(1).writes_in_flight() > 0);

    turns_persisting(&mut net, &stores, &[1, 2, 3], 20);
    assert_eq!(net.node(1).writes_in_flight(), 0);
    for id in [1, 2] {
        assert!(matches!(
            net.take_reply(RequestId(id)),
            Some(Ok(Response::Applied(results))) if matches!(results[0], ApplyResult::Granted { .. })
        ));
    }
}

#[test]
#[should_panic(expected = "writes durable of")]
fn a_store_that_reports_more_writes_durable_than_it_was_given_stops_the_node() {
    let mut net = Net::new(3);
    net.elect(1);
    let submitted = net.node(1).writes_in_flight() + 1_000;
    net.node(1).on_persisted(submitted);
}

#[test]
fn a_late_report_of_fewer_durable_writes_takes_nothing_back() {
    let mut net = Net::new(3);
    net.elect(1);
    net.node(1).propose(RequestId(1), vec![grant("late", "o1")]);
    net.settle();
    assert_eq!(net.node(1).writes_in_flight(), 0);
    // A group's report sent before an inline write was counted, read after.
    net.node(1).on_persisted(1);
    assert_eq!(net.node(1).writes_in_flight(), 0, "a late report took durability back");
}
