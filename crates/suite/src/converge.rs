//! After the faults: how soon the healed cluster serves again, the final
//! linearizable listing, and whether every node ends with the same lock
//! table.
//!
//! "The same table" is read node by node: each node's status (applied and
//! commit index, lock count, last token) and a non-linearizable `get` of
//! every workload key, which that node answers from its own applied table.
//! Tables are compared only when every node has applied the same index,
//! before and after the reads, since expiries still commit while the suite
//! watches.

use std::time::{Duration, Instant};

use fencelock_client::Client;
use serde::Serialize;

use crate::cluster::{leader_of, Cluster};
use crate::history::{Op, OpKind, Outcome, Recorder};

/// One lock in the final listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Listed {
    pub key: String,
    pub token: u64,
    pub owner: String,
}

/// The final linearizable `list` of the workload's keys.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Listing {
    pub invoke_us: u64,
    pub complete_us: u64,
    pub locks: Vec<Listed>,
}

/// One node's table as it answered.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NodeTable {
    pub node: u64,
    pub applied_index: u64,
    pub commit_index: u64,
    pub locks: u64,
    pub last_token: u64,
    /// Each workload key and the token holding it on this node (a shared
    /// key: a pair per holder; a free key: none).
    pub holders: Vec<(String, Option<u64>)>,
}

impl NodeTable {
    /// True when `other` holds the same table at the same index: what must
    /// be equal on every node (the commit index may still differ).
    fn same_table(&self, other: &NodeTable) -> bool {
        self.applied_index == other.applied_index
            && self.locks == other.locks
            && self.last_token == other.last_token
            && self.holders == other.holders
    }
}

/// What the suite saw after healing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Convergence {
    pub bound_ms: u64,
    /// When every fault was undone.
    pub healed_us: u64,
    /// From the heal until a node led.
    pub leader_ms: Option<u64>,
    /// From the heal until a lock was granted and released again.
    pub serving_ms: Option<u64>,
    /// From the heal until every node had the same table.
    pub converged_ms: Option<u64>,
    pub listing: Option<Listing>,
    /// The tables last read: equal ones when converged.
    pub tables: Vec<NodeTable>,
}

/// The key the probe locks, outside the workload's prefix.
pub const PROBE_KEY: &str = "suite-probe/heal";
pub const PROBE_OWNER: &str = "suite-probe";

/// Watches the healed cluster for up to `bound` (each stage gets what is
/// left of it). `probe_client` is the client index the probe's operations
/// get in the history.
pub fn watch(
    cluster: &Cluster,
    keys: &[String],
    prefix: &str,
    recorder: &Recorder,
    bound: Duration,
    probe_client: usize,
) -> Convergence {
    let healed = Instant::now();
    let deadline = healed + bound;
    let since = |instant: Instant| u64::try_from((instant - healed).as_millis()).unwrap_or(u64::MAX);
    let mut result = Convergence {
        bound_ms: u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
        healed_us: recorder.at_us(healed),
        leader_ms: None,
        serving_ms: None,
        converged_ms: None,
        listing: None,
        tables: Vec::new(),
    };
    while Instant::now() < deadline {
        if leader_of(&cluster.statuses()).is_some() {
            result.leader_ms = Some(since(Instant::now()));
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    let mut config = crate::tls::client_config(cluster.endpoints());
    config.request_timeout = Duration::from_millis(1_000);
    config.retry_for = Duration::from_millis(1_000);
    config.owner = Some(crate::tls::owner(PROBE_OWNER).into_bytes());
    let Ok(client) = Client::connect(config) else { return result };
    while result.serving_ms.is_none() && Instant::now() < deadline {
        if probe(&client, recorder, probe_client) {
            result.serving_ms = Some(since(Instant::now()));
        } else {
            // A short backoff: a refusal (not only a timeout) may come fast.
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    while result.listing.is_none() && Instant::now() < deadline {
        let invoke_us = recorder.now_us();
        if let Ok(locks) = client.list(prefix, 0) {
            let locks = locks
                .into_iter()
                .map(|lock| Listed {
                    key: String::from_utf8_lossy(&lock.key).into_owned(),
                    token: lock.token,
                    owner: String::from_utf8_lossy(&lock.owner).into_owned(),
                })
                .collect();
            result.listing = Some(Listing { invoke_us, complete_us: recorder.now_us(), locks });
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    let node_clients: Vec<(u64, Option<Client>)> = cluster
        .ids()
        .into_iter()
        .zip(cluster.endpoints())
        .map(|(id, client_addr)| {
            let mut config = crate::tls::client_config([client_addr]);
            config.request_timeout = Duration::from_millis(500);
            config.retry_for = Duration::ZERO;
            config.owner = Some(crate::tls::owner(PROBE_OWNER).into_bytes());
            (id, Client::connect(config).ok())
        })
        .collect();
    while Instant::now() < deadline {
        if let Some(tables) = read_tables(cluster, &node_clients, keys) {
            let equal = tables.windows(2).all(|pair| pair[0].same_table(&pair[1]));
            result.tables = tables;
            if equal {
                result.converged_ms = Some(since(Instant::now()));
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    result
}

/// One acquire and release of the probe key, recorded; true if both got
/// definite answers and the acquire was granted.
fn probe(client: &Client, recorder: &Recorder, probe_client: usize) -> bool {
    let lease_ms = crate::cluster::LEASE_MIN_MS;
    let record = |invoke_us: u64, kind: OpKind, outcome: Outcome| {
        recorder.record(Op {
            id: 0,
            client: probe_client,
            owner: crate::tls::owner(PROBE_OWNER),
            key: PROBE_KEY.to_owned(),
            invoke_us,
            complete_us: recorder.now_us(),
            kind,
            outcome,
        });
    };
    let invoke = recorder.now_us();
    let kind = OpKind::Acquire { lease_ms, wait_ms: 0 };
    let probe_owner = crate::tls::owner(PROBE_OWNER);
    let grant = match client.acquire_raw(
        probe_owner.as_bytes(),
        PROBE_KEY,
        Duration::from_millis(lease_ms),
        Duration::ZERO,
    ) {
        Ok(grant) => {
            let granted_ms = u64::try_from(grant.lease.as_millis()).unwrap_or(u64::MAX);
            record(
                invoke,
                kind,
                Outcome::Granted { token: grant.token, lease_ms: granted_ms, existing: grant.existing },
            );
            grant
        }
        Err(error) => {
            record(invoke, kind, Outcome::from_error(&error));
            return false;
        }
    };
    let invoke = recorder.now_us();
    let outcome = match client.release(PROBE_KEY, grant.token) {
        Ok(true) => Outcome::Released,
        Ok(false) => Outcome::NotHeld,
        Err(error) => Outcome::from_error(&error),
    };
    let done = outcome.is_definite();
    record(invoke, OpKind::Release { token: grant.token }, outcome);
    done
}

/// Every node's table, or `None` if a node did not answer or applied
/// something while being read.
fn read_tables(
    cluster: &Cluster,
    clients: &[(u64, Option<Client>)],
    keys: &[String],
) -> Option<Vec<NodeTable>> {
    let before = cluster.statuses();
    let mut tables = Vec::new();
    for ((id, status), (_, client)) in before.iter().zip(clients) {
        let status = status.as_ref()?;
        let client = client.as_ref()?;
        let mut holders = Vec::new();
        for key in keys {
            let held = client.holders(key, false).ok()?;
            if held.is_empty() {
                holders.push((key.clone(), None));
            }
            holders.extend(held.iter().map(|lock| (key.clone(), Some(lock.token))));
        }
        tables.push(NodeTable {
            node: *id,
            applied_index: status.applied_index,
            commit_index: status.commit_index,
            locks: status.locks,
            last_token: status.last_token,
            holders,
        });
    }
    let after = cluster.statuses();
    let unchanged = before.iter().zip(&after).all(|((_, a), (_, b))| match (a, b) {
        (Some(a), Some(b)) => a.applied_index == b.applied_index,
        _ => false,
    });
    unchanged.then_some(tables)
}
