//! Decode plus apply of a Grant/Release mix over 100,000 keys, and the
//! snapshot and restore of a table of 100,000 held locks.
//!
//! The table starts with the 50,000 even keys held. One pass releases each
//! of them with its token and grants each odd key: 100,000 commands, encoded
//! as log entries the way the driver writes them, then decoded and applied
//! by `LockTable::apply_entry_into`, on a table that shares nothing, and on
//! a clone (as while a snapshot of it is encoded). The second group measures
//! a snapshot's encoding (done off the node loop, from a clone), the clone
//! (what the node loop pays) and a restore. Run with
//! `cargo bench -p fencelock-fsm`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fencelock_fsm::LockTable;
use fencelock_types::{encode_batch, ApplyResult, Command, Key, LeaseMs, Owner};

const KEYS: usize = 100_000;

fn key(i: usize) -> Key {
    Key::new(format!("bench/lock/{i:06}").into_bytes()).expect("bench keys are valid")
}

fn grant(i: usize) -> Command {
    Command::Grant {
        key: key(i),
        lease_ms: LeaseMs::new(10_000).expect("valid lease"),
        owner: Owner::new(format!("client-{}", i % 256).into_bytes()).expect("valid owner"),
        value: fencelock_types::Value::none(),
        session: None,
    }
}

/// The table with every even key held, and the commands of one pass.
fn workload() -> (LockTable, Vec<Command>) {
    let mut table = LockTable::new();
    let mut commands = Vec::with_capacity(KEYS);
    for i in 0..KEYS {
        if i % 2 == 0 {
            let ApplyResult::Granted { token, .. } = table.apply(grant(i)) else {
                unreachable!("a free key is granted")
            };
            commands.push(Command::Release { key: key(i), token: Some(token), user: None });
        } else {
            commands.push(grant(i));
        }
    }
    (table, commands)
}

fn bench_apply(c: &mut Criterion) {
    let (table, commands) = workload();
    let mut group = c.benchmark_group("decode_apply");
    group.throughput(Throughput::Elements(KEYS as u64));
    group.sample_size(20);
    let snapshot = table.snapshot();
    for commands_per_entry in [1usize, 64] {
        let entries: Vec<Vec<u8>> = commands.chunks(commands_per_entry).map(encode_batch).collect();
        // The table shares nothing with another (restored, not cloned): a
        // node's table is shared only while a snapshot of it is encoded.
        // Then while a snapshot is being encoded from a clone: every node
        // the pass touches is copied once.
        let fresh = || LockTable::restore(&snapshot).expect("the bench's own snapshot restores");
        let shared = || table.clone();
        let setups: [(&str, &dyn Fn() -> LockTable); 2] = [("", &fresh), ("_while_snapshotting", &shared)];
        for (suffix, setup) in setups {
            group.bench_function(format!("100k_keys_{commands_per_entry}_per_entry{suffix}"), |b| {
                b.iter_batched_ref(
                    || (setup(), Vec::with_capacity(commands_per_entry)),
                    |(table, results)| {
                        for entry in &entries {
                            results.clear();
                            table.apply_entry_into(entry, results);
                            black_box(&results);
                        }
                    },
                    BatchSize::LargeInput,
                );
            });
        }
    }
    group.finish();
}

fn bench_snapshot(c: &mut Criterion) {
    let mut table = LockTable::new();
    for i in 0..KEYS {
        table.apply(grant(i));
    }
    let bytes = table.snapshot();
    let mut group = c.benchmark_group("snapshot");
    group.throughput(Throughput::Elements(KEYS as u64));
    group.sample_size(20);
    group.bench_function("100k_locks_take", |b| b.iter(|| black_box(table.snapshot())));
    // What the node loop pays to start a snapshot: the clone that another
    // thread encodes.
    group.bench_function("100k_locks_clone", |b| b.iter(|| black_box(table.clone())));
    group.bench_function("100k_locks_restore", |b| {
        b.iter(|| black_box(LockTable::restore(&bytes).expect("the bench's own snapshot restores")))
    });
    group.finish();
}

criterion_group!(benches, bench_apply, bench_snapshot);
criterion_main!(benches);
