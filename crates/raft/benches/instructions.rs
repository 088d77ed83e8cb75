//! Work per request of the sans-IO replica, for an instruction counter: a
//! 3-node cluster in one thread (in-memory stores, messages delivered at
//! once, time advanced by the loop, no threads), 64 clients each acquiring
//! and releasing a key of its own, for a fixed number of acquire-release
//! cycles. Deterministic: the same requests go through the same turns, so
//! instructions counted before and after a change compare exactly:
//!
//! ```text
//! cargo bench -p fencelock-raft --bench instructions --no-run
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null target/release/deps/instructions-*
//! ```
//!
//! `FENCELOCK_CYCLES` sets the cycles (default 20,000). It prints the
//! cycles, entries and writes, so that two runs can be checked to have done
//! the same work.

use fencelock_raft::{Config, Durable, MemStore, NodeId, Replica, RequestId, Response};

/// fencelockd's allocator (`crates/server/src/main.rs`), so that the count
/// is of the work fencelockd does: with glibc's malloc this workload costs
/// about a fifth more (1,420 M instructions against 1,177 M at 7595c5c).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use fencelock_types::{ApplyResult, Command, FencingToken, Key, LeaseMs, Owner, Value};

const NODES: u64 = 3;
const CLIENTS: u64 = 64;

/// What each client waits for.
#[derive(Clone, Copy)]
enum Client {
    Acquiring,
    Releasing,
}

fn key(client: u64) -> Key {
    Key::new(format!("bench/{client}").into_bytes()).expect("a valid key")
}

fn grant(client: u64) -> Command {
    Command::Grant {
        key: key(client),
        lease_ms: LeaseMs::new(30_000).expect("a valid lease"),
        owner: Owner::new(format!("client-{client}").into_bytes()).expect("a valid owner"),
        value: Value::none(),
        session: None,
    }
}

fn release(client: u64, token: FencingToken) -> Command {
    Command::Release { key: key(client), token: Some(token), user: None }
}

fn main() {
    let cycles: u64 = std::env::var("FENCELOCK_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(20_000);
    let logger = slog::Logger::root(slog::Discard, slog::o!());
    let voters: Vec<NodeId> = (1..=NODES).map(NodeId).collect();
    let mut stores: Vec<MemStore> = (0..NODES).map(|_| MemStore::new()).collect();
    let mut replicas: Vec<Replica> = stores
        .iter_mut()
        .zip(1..)
        .map(|(store, id)| {
            let mut config = Config::new(NodeId(id), voters.clone());
            // Node 1 times out first and leads; the others never campaign.
            if id != 1 {
                config.raft.election_ticks = 1_000;
                config.raft.election_ticks_max = Some(1_001);
            }
            Replica::open(config, store.recover().expect("an empty store recovers"), &logger)
                .expect("a replica opens")
        })
        .collect();
    let mut clients = vec![Client::Acquiring; CLIENTS as usize];
    let mut next_id = 1u64;
    // Each client's request in flight, by id.
    let mut in_flight: std::collections::BTreeMap<u64, u64> = std::collections::BTreeMap::new();
    let (mut done, mut now_ms, mut started) = (0u64, 0u64, false);
    while done < cycles {
        now_ms += 1;
        for replica in &mut replicas {
            replica.set_now(now_ms);
            if now_ms % 10 == 0 {
                replica.tick();
            }
        }
        if !started && replicas[0].is_leader_ready() {
            started = true;
            for (client, state) in clients.iter().enumerate() {
                if let Client::Acquiring = state {
                    replicas[0].propose(RequestId(next_id), vec![grant(client as u64)]);
                    in_flight.insert(next_id, client as u64);
                    next_id += 1;
                }
            }
        }
        let mut messages = Vec::new();
        let mut answers = Vec::new();
        for (replica, store) in replicas.iter_mut().zip(&mut stores) {
            replica.run_ready().expect("no fatal error");
            let effects = replica.take_effects();
            messages.extend(effects.messages);
            answers.extend(effects.replies);
            if let Some(last) = effects.writes.last().map(|write| write.n) {
                for write in &effects.writes {
                    store.write(&write.batch).expect("an in-memory write");
                }
                replica.on_persisted(last);
            }
        }
        for message in messages {
            let to = message.to;
            replicas[(to - 1) as usize].step(message);
        }
        for (id, answer) in answers {
            let Some(client) = in_flight.remove(&id.0) else { continue };
            let command = match (clients[client as usize], answer) {
                (Client::Acquiring, Ok(Response::Applied(results))) => match results.as_slice() {
                    [ApplyResult::Granted { token, .. }] => {
                        clients[client as usize] = Client::Releasing;
                        release(client, *token)
                    }
                    other => panic!("client {client}'s acquire: {other:?}"),
                },
                (Client::Releasing, Ok(Response::Applied(_))) => {
                    done += 1;
                    clients[client as usize] = Client::Acquiring;
                    grant(client)
                }
                (_, other) => panic!("client {client}: {other:?}"),
            };
            replicas[0].propose(RequestId(next_id), vec![command]);
            in_flight.insert(next_id, client);
            next_id += 1;
        }
    }
    let stats = replicas[0].stats();
    println!(
        "{done} cycles in {now_ms} simulated ms: leader {} entries proposed, {} writes; requests {}",
        stats.entries_proposed,
        stats.writes,
        next_id - 1
    );
}
