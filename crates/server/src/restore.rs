//! `fencelockd --restore FILE`: seeds a blank store with a backup, so that a
//! new cluster starts from it.
//!
//! Every node of the new cluster is started once with the same file and the
//! same `--peers`, and writes the same initial state: a raft snapshot at
//! index 1, term 1, whose configuration is the `--peers` ids and whose data
//! is the backup's table without its cluster id and member directory
//! (`LockTable::for_restore`). The nodes thus agree from the start, and none
//! goes through a blank store's start-up (its store is not blank). The
//! first leader of the new cluster finds no cluster id, so it proposes a
//! Bootstrap with a new id and its clock as the token floor: tokens go on
//! above both the backup's counter and that floor, never again issuing one
//! that the old cluster may have issued after the backup was taken.

use std::path::Path;

use anyhow::{bail, Context, Result};
use fencelock_fsm::LockTable;
use fencelock_raft::{Durable, EngineStore, WriteBatch};
use fencelock_types::FencingToken;
use raft::prelude::{ConfState, HardState, Snapshot};
use slog::{info, Logger};

/// The index and term of the seeded snapshot: the first a log can have.
const SEED_INDEX: u64 = 1;
const SEED_TERM: u64 = 1;

/// What to seed a store with, and where it is.
#[derive(Debug)]
pub struct Seed<'a> {
    /// The backup.
    pub file: &'a Path,
    /// The new cluster's voters: the ids of `--peers`.
    pub voters: Vec<u64>,
    /// For messages: the node's data directory and id.
    pub data_dir: &'a Path,
    pub node_id: u64,
}

/// Seeds `store`, which must be blank, with the backup in `seed.file`,
/// checked whole first. Nothing is written unless both hold.
pub fn restore(store: &mut EngineStore, seed: &Seed<'_>, logger: &Logger) -> Result<()> {
    if !store.is_blank().context("cannot read the raft log")? {
        bail!(
            "--restore needs an empty data directory; {} holds node {}'s data (drop --restore to start \
             the node on it, or give it an empty --data-dir)",
            seed.data_dir.display(),
            seed.node_id
        );
    }
    let file = seed.file.display();
    let bytes = std::fs::read(seed.file).with_context(|| format!("--restore: cannot read {file}"))?;
    let table = LockTable::restore(&bytes)
        .with_context(|| format!("--restore: {file} is not a whole lock-table backup"))?
        .for_restore();
    store.write(&seed_batch(&table, &seed.voters)).context("--restore: cannot write the raft log")?;
    info!(logger, "restored the lock table from a backup";
        "file" => %file, "locks" => table.len(),
        "last_token" => table.last_token().map_or(0, FencingToken::get),
        "voters" => ?seed.voters);
    Ok(())
}

/// The write that seeds a blank store with `table`: the same bytes on
/// every node given the same table and voters.
fn seed_batch(table: &LockTable, voters: &[u64]) -> WriteBatch {
    let conf_state = ConfState::from((voters.to_vec(), vec![]));
    let mut snapshot = Snapshot::default();
    snapshot.set_data(table.snapshot().into());
    let metadata = snapshot.mut_metadata();
    metadata.index = SEED_INDEX;
    metadata.term = SEED_TERM;
    metadata.set_conf_state(conf_state.clone());
    let hard_state = HardState { term: SEED_TERM, commit: SEED_INDEX, ..Default::default() };
    WriteBatch {
        snapshot: Some(snapshot),
        install: true,
        hard_state: Some(hard_state),
        conf_state: Some(conf_state),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use fencelock_raft::{Config, Node, NodeConfig, NodeId};
    use fencelock_types::{ClusterId, Command, Key, LeaseMs, Owner};

    use super::*;

    fn logger() -> Logger {
        Logger::root(slog::Discard, slog::o!())
    }

    /// A table of two locks, named by an old cluster, with a member record.
    fn backup() -> LockTable {
        let mut table = LockTable::new();
        table.apply(Command::Bootstrap { cluster_id: ClusterId::new([3; 16]), token_floor: 1_000, level: 2 });
        for name in ["jobs/a", "jobs/b"] {
            table.apply(Command::Grant {
                session: None,
                key: Key::new(name.as_bytes().to_vec()).unwrap(),
                lease_ms: LeaseMs::new(60_000).unwrap(),
                owner: Owner::new(b"worker".to_vec()).unwrap(),
                value: fencelock_types::Value::none(),
            });
        }
        table.set_member(
            9,
            fencelock_fsm::MemberAddrs { peer_addr: "old:7001".into(), client_addr: "old:7101".into() },
        );
        table
    }

    fn seed<'a>(file: &'a Path, data_dir: &'a Path) -> Seed<'a> {
        Seed { file, voters: vec![1, 2, 3], data_dir, node_id: 2 }
    }

    #[test]
    fn a_seeded_store_opens_a_running_node_with_the_backups_locks() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("backup.flkt");
        std::fs::write(&file, backup().snapshot()).unwrap();
        let raft_dir = dir.path().join("raft");
        let mut store = EngineStore::open(&raft_dir).unwrap();
        restore(&mut store, &seed(&file, dir.path()), &logger()).unwrap();
        assert!(!store.is_blank().unwrap());
        drop(store);

        let recovered = EngineStore::open(&raft_dir).unwrap().recover().unwrap();
        assert!(!recovered.is_blank());
        assert_eq!(recovered.conf_state.as_ref().unwrap().voters, vec![1, 2, 3]);
        assert_eq!((recovered.snapshot.get_metadata().index, recovered.snapshot.get_metadata().term), (1, 1));
        let config = NodeConfig {
            driver: Config::new(NodeId(2), vec![NodeId(1), NodeId(2), NodeId(3)]),
            tick_ms: Some(10),
            election_seed: None,
        };
        let node: Node<()> = Node::open(config, recovered, &logger()).unwrap();
        // Not blank: no waiting for the peers' hellos.
        assert!(!node.is_starting());
        let table = node.replica().unwrap().table();
        assert_eq!(table, &backup().for_restore());
        assert_eq!(table.cluster_id(), None);
        assert_eq!(table.members().count(), 0);
        assert_eq!(table.len(), 2);
        assert_eq!(table.last_token().map(FencingToken::get), Some(1_002));
    }

    #[test]
    fn every_node_writes_the_same_seed() {
        let table = backup().for_restore();
        let one = seed_batch(&table, &[1, 2, 3]);
        let two = seed_batch(&table, &[1, 2, 3]);
        assert_eq!(format!("{one:?}"), format!("{two:?}"));
    }

    #[test]
    fn a_store_with_data_and_a_damaged_file_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("backup.flkt");
        let mut bytes = backup().snapshot();
        std::fs::write(&file, &bytes).unwrap();
        let mut store = EngineStore::open(&dir.path().join("raft")).unwrap();
        restore(&mut store, &seed(&file, dir.path()), &logger()).unwrap();
        // A restart with --restore still given: refused, nothing written.
        let again = restore(&mut store, &seed(&file, dir.path()), &logger()).unwrap_err();
        let message = format!("{again:#}");
        assert!(message.contains("--restore needs an empty data directory;"), "{message}");
        assert!(message.contains("holds node 2's data"), "{message}");

        // A flipped byte in the body: refused by its checksum, the store
        // stays blank.
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        std::fs::write(&file, &bytes).unwrap();
        let mut blank = EngineStore::open(&dir.path().join("raft-2")).unwrap();
        let damaged = restore(&mut blank, &seed(&file, dir.path()), &logger()).unwrap_err();
        let message = format!("{damaged:#}");
        assert!(
            message.contains("is not a whole lock-table backup") && message.contains("checksum"),
            "{message}"
        );
        assert!(blank.is_blank().unwrap());
        // A file that is not there.
        let missing =
            restore(&mut blank, &seed(&dir.path().join("nope"), dir.path()), &logger()).unwrap_err();
        assert!(format!("{missing:#}").contains("cannot read"), "{missing:#}");
    }
}
