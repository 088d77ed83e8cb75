//! Cluster ids through real processes: the first leader names its cluster,
//! every node learns and keeps the name across restarts, and a node that
//! carries another cluster's data (a misconfigured machine, a copied data
//! directory) is refused at the hello by both sides, while the cluster
//! serves on.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{Cluster, DEADLINE};
use fencelock_client::Client;

/// Waits until node `id` of `cluster` reports a cluster id, and returns it.
fn cluster_id_of(cluster: &Cluster, client: &Client, id: u64) -> String {
    let deadline = Instant::now() + DEADLINE;
    loop {
        if let Ok(status) = client.status(cluster.client_addr(id)) {
            if !status.cluster_id.is_empty() {
                return status.cluster_id;
            }
        }
        assert!(Instant::now() < deadline, "node {id} never learnt its cluster id\n{}", cluster.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn a_node_with_another_clusters_data_is_refused_and_the_cluster_serves_on() {
    let mut ours = Cluster::start(3);
    let client = ours.client();
    ours.leader(&client);
    let named = cluster_id_of(&ours, &client, 1);
    assert_eq!(named.len(), 32, "{named}");
    for id in 2..=3 {
        assert_eq!(cluster_id_of(&ours, &client, id), named);
    }
    let before = client.acquire(b"jobs/a", Duration::from_secs(30), Duration::ZERO).unwrap();

    let mut theirs = Cluster::start(3);
    let their_client = theirs.client();
    theirs.leader(&their_client);
    let foreign = cluster_id_of(&theirs, &their_client, 3);
    assert_ne!(foreign, named, "two clusters drew one name");
    // Their node 3 has issued tokens too.
    drop(their_client.acquire(b"jobs/theirs", Duration::from_secs(30), Duration::ZERO).unwrap());

    // Our node 3's machine comes back with their node 3's data directory.
    theirs.kill(3);
    ours.kill(3);
    std::fs::remove_dir_all(ours.data_dir(3)).unwrap();
    copy_dir(&theirs.data_dir(3), &ours.data_dir(3));
    drop(theirs);
    ours.launch(3);

    // Both sides refuse the other's hello, and say why.
    let deadline = Instant::now() + DEADLINE;
    while !(ours.log(1).contains("of another cluster") && ours.log(3).contains("of another cluster")) {
        assert!(Instant::now() < deadline, "no hello was refused\n{}", ours.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    // The stranger kept its own name and never joined.
    assert_eq!(cluster_id_of(&ours, &client, 3), foreign);
    assert_eq!(cluster_id_of(&ours, &client, 1), named);
    // Our cluster serves on, tokens still increasing.
    let after = client.acquire(b"jobs/b", Duration::from_secs(30), Duration::ZERO).unwrap();
    assert!(after.token() > before.token());
    assert!(client.check(b"jobs/a", before.token()).unwrap());
    // The name survives a restart of a node of ours.
    ours.kill(2);
    ours.launch(2);
    assert_eq!(cluster_id_of(&ours, &client, 2), named);
}

#[test]
fn a_cluster_recreated_from_nothing_issues_tokens_above_its_old_ones() {
    let mut cluster = Cluster::start(3);
    let client = cluster.client();
    cluster.leader(&client);
    let before = client.acquire_raw(b"o", b"jobs/a", Duration::from_secs(30), Duration::ZERO).unwrap().token;
    // The founding leader's wall clock in microseconds: far above 1.
    assert!(before > 1_700_000_000_000_000, "token {before} is not above the founding floor");
    let more = client.acquire_raw(b"o", b"jobs/b", Duration::from_secs(30), Duration::ZERO).unwrap().token;
    assert_eq!(more, before + 1);

    // Every node loses its data.
    for id in 1..=3 {
        cluster.kill(id);
        std::fs::remove_dir_all(cluster.data_dir(id)).unwrap();
    }
    for id in 1..=3 {
        cluster.launch(id);
    }
    cluster.leader(&client);
    let after = client.acquire_raw(b"o", b"jobs/a", Duration::from_secs(30), Duration::ZERO).unwrap().token;
    assert!(after > more, "the re-created cluster issued token {after}, not above {more}");
}
