//! The workloads, run against a live cluster.
//!
//! N clients are N connections to the leader, each with one request in
//! flight, as N independent processes would be. The lock workloads drive
//! them from one event loop (`events.rs`) by default, or with one [`Client`]
//! and one thread per connection (`--generator threads`); renewals always
//! use threads. The worker threads run their loops from the start; the main
//! thread lets them warm up, opens the measured window, closes it, and only
//! requests completed inside it are counted and timed. Latencies go into one
//! HDR histogram per thread, merged at the end, so the threads share nothing
//! while they run but one atomic phase flag.
//!
//! Through `fencelock-client`, the lock workloads use `acquire_raw`, the
//! protocol's acquire without a guard: a `LockGuard` would also register
//! the lock with the client's background renewer and wake its thread on
//! every acquire, which measures the client's bookkeeping rather than the
//! service.

use std::collections::BTreeMap;
use std::net::ToSocketAddrs;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use fencelock_client::{Client, NodeStatus};

use crate::events::{self, EventRun};
use crate::order::{self, GrantRecord};
use crate::report::{rate, seconds, HotKeyReport, LatencySummary, ReadyReport, RenewReport, RunReport};
use crate::tally::{Shared, Tally, ERROR_PAUSE, MEASURE, STOP};

/// What a run is asked to do; see the flags in `main.rs`.
#[derive(Clone, Debug)]
pub struct Settings {
    pub endpoints: Vec<String>,
    pub clients: usize,
    pub warmup: Duration,
    pub duration: Duration,
    pub lease: Duration,
    pub wait: Duration,
    pub locks: usize,
    pub renew_batch: usize,
    pub key_prefix: String,
    pub grants_csv: Option<PathBuf>,
    pub generator: Generator,
}

/// How the lock workloads drive their client connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Generator {
    /// One thread drives every connection over mio, speaking the protocol
    /// (`events.rs`): the generator costs the shared machine little.
    Events,
    /// One `fencelock-client` and one blocking thread per connection.
    Threads,
}

/// The workloads `cargo xtask bench` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Each client acquires (no wait) and releases its own key, in a loop.
    Distinct,
    /// Every client acquires one shared key, waiting in the leader's FIFO
    /// queue, and releases it as soon as it is granted.
    HotKey,
    /// `--locks` locks are acquired, spread over the clients; then each
    /// client renews its locks, many per request, in a loop.
    Renew,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Distinct => "distinct",
            Workload::HotKey => "hot-key",
            Workload::Renew => "renew",
        }
    }
}

/// The locks one client holds, as `(key, token)`: what a renew request names.
type Held = Vec<(Vec<u8>, u64)>;

/// Client threads per client in the renew workload's setup and cleanup:
/// enough requests in flight to take 10,000 locks in a few seconds.
const SETUP_THREADS_PER_CLIENT: usize = 4;

/// The leader every endpoint agrees on.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Leader {
    id: u64,
    addr: String,
    term: u64,
}

/// A client with the given endpoints and the library's default timeouts.
fn connect(endpoints: &[String]) -> Result<Client> {
    Client::connect(crate::tls::client_config(endpoints.iter().cloned())).context("cannot create a client")
}

/// A client for status calls: one quick attempt each.
fn status_client(endpoints: &[String]) -> Result<Client> {
    let mut config = crate::tls::client_config(endpoints.iter().cloned());
    config.request_timeout = Duration::from_secs(1);
    config.retry_for = Duration::from_secs(1);
    Client::connect(config).context("cannot create a status client")
}

/// The leader, if every endpoint answers and names the same one, and that
/// one says it leads.
fn agreed_leader(client: &Client, endpoints: &[String]) -> Option<Leader> {
    let statuses: Vec<NodeStatus> =
        endpoints.iter().map(|endpoint| client.status(endpoint)).collect::<Result<_, _>>().ok()?;
    let leader_id = statuses.first()?.leader_id;
    if leader_id == 0 || statuses.iter().any(|status| status.leader_id != leader_id) {
        return None;
    }
    let at = statuses.iter().position(|status| status.node_id == leader_id && status.role == "leader")?;
    Some(Leader { id: leader_id, addr: endpoints[at].clone(), term: statuses[at].term })
}

/// The endpoints with the leader's first, so that no client connection is
/// spent on a redirect.
fn leader_first(endpoints: &[String], leader: &Leader) -> Vec<String> {
    let mut ordered = vec![leader.addr.clone()];
    ordered.extend(endpoints.iter().filter(|endpoint| **endpoint != leader.addr).cloned());
    ordered
}

/// Waits for a leader that every node agrees on, then has it grant and
/// release a probe lock.
pub fn ready(endpoints: &[String], timeout: Duration) -> Result<ReadyReport> {
    let started = Instant::now();
    let status = status_client(endpoints)?;
    let leader = loop {
        if let Some(leader) = agreed_leader(&status, endpoints) {
            break leader;
        }
        if started.elapsed() >= timeout {
            bail!("no leader that every node of {endpoints:?} agrees on within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut config = crate::tls::client_config(leader_first(endpoints, &leader));
    config.retry_for = timeout.saturating_sub(started.elapsed()).max(Duration::from_secs(1));
    let probe = Client::connect(config).context("cannot create the probe client")?;
    let key = format!("bench/ready-probe/{}", std::process::id());
    let grant = probe
        .acquire_raw(probe.owner(), &key, Duration::from_secs(5), Duration::ZERO)
        .with_context(|| format!("the leader at {} did not grant the probe lock", leader.addr))?;
    probe.release(&key, grant.token).context("the probe lock was not released")?;
    Ok(ReadyReport {
        leader_id: leader.id,
        leader_addr: leader.addr,
        term: leader.term,
        waited_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    })
}

/// Runs `workload` and reports it.
pub fn run(workload: Workload, settings: &Settings) -> Result<RunReport> {
    let status = status_client(&settings.endpoints)?;
    let leader = agreed_leader(&status, &settings.endpoints)
        .with_context(|| format!("the nodes of {:?} do not agree on a leader", settings.endpoints))?;
    let events = settings.generator == Generator::Events && workload != Workload::Renew;
    eprintln!(
        "fencelock-bench: {} with {} clients ({}), leader {} at {}: warm-up {:?}, measuring {:?}",
        workload.name(),
        settings.clients,
        if events { "one event loop" } else { "a thread each" },
        leader.id,
        leader.addr,
        settings.warmup,
        settings.duration
    );
    let hot_key = format!("{}/hot", settings.key_prefix);
    let key = |index: usize| match workload {
        Workload::HotKey => hot_key.clone(),
        _ => format!("{}/distinct/{index}", settings.key_prefix),
    };
    let (wait, grants) = match workload {
        Workload::HotKey => (settings.wait, true),
        _ => (Duration::ZERO, false),
    };
    let window = if events {
        let leader_addr = leader
            .addr
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .with_context(|| format!("cannot resolve the leader's address {}", leader.addr))?;
        let run = EventRun {
            leader: leader_addr,
            clients: settings.clients,
            key: &key,
            lease: settings.lease,
            wait,
            grants,
            owner_prefix: crate::tls::owner(&format!("{}/owner", settings.key_prefix)),
        };
        let connected = std::sync::Mutex::new(Some(events::connect(&run)?));
        measure(settings, &status, &leader, 1, |_, shared| {
            let taken = connected.lock().ok().and_then(|mut connected| connected.take());
            let (poll, connections) = taken.context("the event loop ran twice")?;
            events::drive(&run, poll, connections, shared)
        })?
    } else {
        let endpoints = leader_first(&settings.endpoints, &leader);
        let clients: Vec<Client> =
            (0..settings.clients).map(|_| connect(&endpoints)).collect::<Result<_>>()?;
        // Connections open on first use: open them all now, so that no
        // connection set-up (nor the server's threads starting for it) lands
        // in a timed request, or makes an early acquire look overtaken.
        for client in &clients {
            client
                .status(&leader.addr)
                .with_context(|| format!("cannot reach the leader at {}", leader.addr))?;
        }
        if workload == Workload::Renew {
            return renew(settings, &status, &leader, &clients);
        }
        measure(settings, &status, &leader, clients.len(), |index, shared| {
            Ok(cycle_loop(&clients[index], shared, &key(index), settings.lease, wait, index, grants))
        })?
    };
    match workload {
        Workload::HotKey => {
            let hot_key = hot_key_report(&window.tally.grants, settings);
            if let Some(path) = &settings.grants_csv {
                write_grants_csv(path, &window.tally.grants)?;
            }
            Ok(window.report(workload, settings, &leader, 2, Some(hot_key), None))
        }
        _ => Ok(window.report(workload, settings, &leader, 2, None, None)),
    }
}

/// Acquire then release `key`, in a loop until the run stops. With
/// `grants`, every grant is recorded for the order checks.
fn cycle_loop(
    client: &Client,
    shared: &Shared,
    key: &str,
    lease: Duration,
    wait: Duration,
    index: usize,
    grants: bool,
) -> Tally {
    let mut tally = Tally::default();
    let owner = client.owner().to_vec();
    loop {
        let phase = shared.phase();
        if phase == STOP {
            return tally;
        }
        let sent = Instant::now();
        let grant = match client.acquire_raw(&owner, key, lease, wait) {
            Ok(grant) => grant,
            Err(err) => {
                tally.error("acquire", &err);
                if !err.is_not_obtained() {
                    std::thread::sleep(ERROR_PAUSE);
                }
                continue;
            }
        };
        let granted = Instant::now();
        // Taken before the release goes out: the server releases later than
        // this, so the hold the order checks see is never too long.
        let release_sent = Instant::now();
        let released = client.release(key, grant.token);
        let done = Instant::now();
        if grants {
            tally.grants.push(GrantRecord {
                measured: phase == MEASURE,
                client: index,
                token: grant.token,
                sent_ns: shared.nanos(sent),
                granted_ns: shared.nanos(granted),
                release_sent_ns: shared.nanos(release_sent),
            });
        }
        match released {
            Ok(true) if phase == MEASURE => {
                tally.cycles += 1;
                tally.time("acquire", granted - sent);
                tally.time("release", done - granted);
            }
            Ok(true) => {}
            Ok(false) => tally.count("release:not_held".to_owned()),
            Err(err) => {
                tally.error("release", &err);
                std::thread::sleep(ERROR_PAUSE);
            }
        }
    }
}

/// What one measured window gave.
struct Window {
    tally: Tally,
    measured: Duration,
    leader_changed: bool,
    entries_committed: u64,
    generator_cpu_s: f64,
}

impl Window {
    /// The report of a window whose cycles are `requests_per_cycle` requests each.
    fn report(
        self,
        workload: Workload,
        settings: &Settings,
        leader: &Leader,
        requests_per_cycle: u64,
        hot_key: Option<HotKeyReport>,
        renew: Option<RenewReport>,
    ) -> RunReport {
        let measured_s = seconds(self.measured);
        let requests = self.tally.cycles * requests_per_cycle;
        RunReport {
            workload: workload.name().to_owned(),
            clients: settings.clients,
            leader_id: leader.id,
            leader_changed: self.leader_changed,
            warmup_s: seconds(settings.warmup),
            measured_s,
            cycles: self.tally.cycles,
            cycles_per_s: rate(self.tally.cycles, measured_s),
            latency_us: self
                .tally
                .latency
                .iter()
                .map(|(kind, histogram)| ((*kind).to_owned(), LatencySummary::of(histogram)))
                .collect(),
            errors: self.tally.errors,
            entries_committed: self.entries_committed,
            requests_per_entry: if self.entries_committed == 0 {
                0.0
            } else {
                (requests as f64 / self.entries_committed as f64 * 100.0).round() / 100.0
            },
            generator_cpu_s: (self.generator_cpu_s * 100.0).round() / 100.0,
            generator_cpu_total_s: own_cpu_seconds().map_or(0.0, |cpu| (cpu * 100.0).round() / 100.0),
            hot_key,
            renew,
        }
    }
}

/// Starts `workers` threads running `worker`, lets them warm up,
/// measures, stops them and merges what they counted.
fn measure<W>(
    settings: &Settings,
    status: &Client,
    leader: &Leader,
    workers: usize,
    worker: W,
) -> Result<Window>
where
    W: Fn(usize, &Shared) -> Result<Tally> + Sync,
{
    let shared = Shared::new();
    std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(workers);
        for index in 0..workers {
            let (shared, worker) = (&shared, &worker);
            let spawned = std::thread::Builder::new()
                .name(format!("bench-client-{index}"))
                .spawn_scoped(scope, move || worker(index, shared));
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(err) => {
                    // The threads already started must see the end, or the
                    // scope would wait for them forever.
                    shared.set_phase(STOP);
                    return Err(anyhow!("cannot start client thread {index}: {err}"));
                }
            }
        }
        std::thread::sleep(settings.warmup);
        let before = status.status(&leader.addr).ok();
        let cpu_before = own_cpu_seconds();
        shared.set_phase(MEASURE);
        let started = Instant::now();
        std::thread::sleep(settings.duration);
        shared.set_phase(STOP);
        let measured = started.elapsed();
        let cpu_after = own_cpu_seconds();
        let after = status.status(&leader.addr).ok();
        eprintln!("fencelock-bench: measured {measured:?}; waiting for the clients to finish their cycle");
        let mut tally = Tally::default();
        for handle in handles {
            let thread = handle.join().map_err(|_| anyhow!("a client thread panicked"))??;
            tally.merge(thread)?;
        }
        let (leader_changed, entries_committed) = match (&before, &after) {
            (Some(before), Some(after)) => (
                before.term != after.term || before.role != "leader" || after.role != "leader",
                after.commit_index.saturating_sub(before.commit_index),
            ),
            _ => (true, 0),
        };
        let generator_cpu_s = match (cpu_before, cpu_after) {
            (Some(before), Some(after)) => after - before,
            _ => 0.0,
        };
        Ok(Window { tally, measured, leader_changed, entries_committed, generator_cpu_s })
    })
}

fn write_grants_csv(path: &std::path::Path, grants: &[GrantRecord]) -> Result<()> {
    let mut text = String::from("client,token,sent_ns,granted_ns,release_sent_ns,measured\n");
    for grant in grants {
        text.push_str(&format!(
            "{},{},{},{},{},{}\n",
            grant.client, grant.token, grant.sent_ns, grant.granted_ns, grant.release_sent_ns, grant.measured
        ));
    }
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}

fn hot_key_report(grants: &[GrantRecord], settings: &Settings) -> HotKeyReport {
    let mut per_client = vec![0u64; settings.clients];
    for grant in grants {
        if let Some(count) = per_client.get_mut(grant.client) {
            *count += 1;
        }
    }
    // Queue order is judged on the measured window only: the warm-up opens
    // with every client sending at once while the threads start, where a
    // send can lag its timestamp by more than the gaps being judged.
    let measured: Vec<GrantRecord> = grants.iter().filter(|grant| grant.measured).copied().collect();
    HotKeyReport {
        lease_ms: millis(settings.lease),
        wait_ms: millis(settings.wait),
        grants: grants.len() as u64,
        granted_while_held: order::granted_while_held(grants),
        token_order_violations: order::token_order_violations(grants),
        fifo_inversions: order::fifo_inversions(&measured, 0),
        fifo_inversions_over_1ms: order::fifo_inversions(&measured, 1_000_000),
        fifo_max_inversion_gap_us: order::fifo_max_inversion_gap_ns(&measured) / 1_000,
        grants_per_client_min: per_client.iter().copied().min().unwrap_or(0),
        grants_per_client_max: per_client.iter().copied().max().unwrap_or(0),
    }
}

/// The renew workload: take `locks` locks, renew them in a loop, measure,
/// then release them all.
fn renew(settings: &Settings, status: &Client, leader: &Leader, clients: &[Client]) -> Result<RunReport> {
    if settings.locks < settings.clients {
        bail!("--locks ({}) must be at least --clients ({})", settings.locks, settings.clients);
    }
    // Lock i belongs to client i % clients.
    let keys: Vec<Vec<String>> = (0..settings.clients)
        .map(|client| {
            (client..settings.locks)
                .step_by(settings.clients)
                .map(|i| format!("{}/renew/{i}", settings.key_prefix))
                .collect()
        })
        .collect();
    let setup_started = Instant::now();
    let held = acquire_all(clients, &keys, settings.lease)?;
    let setup = setup_started.elapsed();
    eprintln!("fencelock-bench: {} locks acquired in {setup:?}", settings.locks);
    let batch = match settings.renew_batch {
        0 => keys.iter().map(Vec::len).max().unwrap_or(1),
        batch => batch,
    };
    let window = measure(settings, status, leader, clients.len(), |index, shared| {
        Ok(renew_loop(&clients[index], shared, &held[index], batch, settings.lease))
    });
    // Released whatever the measurement gave, so that a failed run leaves no
    // locks behind on a cluster that lives on.
    let cleanup_errors = release_all(clients, &held);
    let mut window = window?;
    for (what, count) in cleanup_errors {
        *window.tally.errors.entry(what).or_default() += count;
    }
    let measured_s = seconds(window.measured);
    let renew = RenewReport {
        locks_held: settings.locks as u64,
        locks_per_request: batch as u64,
        lease_ms: millis(settings.lease),
        setup_s: seconds(setup),
        locks_renewed: window.tally.locks_renewed,
        locks_renewed_per_s: rate(window.tally.locks_renewed, measured_s),
        requests_per_s: rate(window.tally.cycles, measured_s),
        not_renewed: window.tally.not_renewed,
    };
    Ok(window.report(Workload::Renew, settings, leader, 1, None, Some(renew)))
}

/// Renews `locks`, `batch` per request, until the run stops.
fn renew_loop(
    client: &Client,
    shared: &Shared,
    locks: &[(Vec<u8>, u64)],
    batch: usize,
    lease: Duration,
) -> Tally {
    let mut tally = Tally::default();
    loop {
        for chunk in locks.chunks(batch.max(1)) {
            let phase = shared.phase();
            if phase == STOP {
                return tally;
            }
            let sent = Instant::now();
            match client.renew(chunk, lease) {
                Ok(results) => {
                    let renewed = results.iter().filter(|(_, _, renewed)| *renewed).count() as u64;
                    tally.not_renewed += results.len() as u64 - renewed;
                    if phase == MEASURE {
                        tally.time("renew", sent.elapsed());
                        tally.cycles += 1;
                        tally.locks_renewed += renewed;
                    }
                }
                Err(err) => {
                    tally.error("renew", &err);
                    std::thread::sleep(ERROR_PAUSE);
                }
            }
        }
        if locks.is_empty() {
            return tally;
        }
    }
}

/// Acquires every key of `keys[c]` through `clients[c]`, several requests in
/// flight per client. Returns each client's `(key, token)` list.
fn acquire_all(clients: &[Client], keys: &[Vec<String>], lease: Duration) -> Result<Vec<Held>> {
    std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for (client, keys) in clients.iter().zip(keys) {
            let mut client_handles = Vec::new();
            for part in 0..SETUP_THREADS_PER_CLIENT {
                let handle = std::thread::Builder::new().name(format!("bench-setup-{part}")).spawn_scoped(
                    scope,
                    move || -> Result<Held> {
                        let mut held = Vec::new();
                        for key in keys.iter().skip(part).step_by(SETUP_THREADS_PER_CLIENT) {
                            let grant = client
                                .acquire_raw(client.owner(), key, lease, Duration::ZERO)
                                .with_context(|| format!("cannot acquire {key} for the renew workload"))?;
                            held.push((key.clone().into_bytes(), grant.token));
                        }
                        Ok(held)
                    },
                )?;
                client_handles.push(handle);
            }
            handles.push(client_handles);
        }
        let mut held = Vec::with_capacity(clients.len());
        for client_handles in handles {
            let mut locks = Vec::new();
            for handle in client_handles {
                locks.extend(handle.join().map_err(|_| anyhow!("a setup thread panicked"))??);
            }
            held.push(locks);
        }
        Ok(held)
    })
}

/// Releases every lock in `held`; returns the failures by kind.
fn release_all(clients: &[Client], held: &[Held]) -> BTreeMap<String, u64> {
    let mut errors = BTreeMap::new();
    std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for (client, locks) in clients.iter().zip(held) {
            for part in 0..SETUP_THREADS_PER_CLIENT {
                let spawned = std::thread::Builder::new().name(format!("bench-cleanup-{part}")).spawn_scoped(
                    scope,
                    move || {
                        let mut tally = Tally::default();
                        for (key, token) in locks.iter().skip(part).step_by(SETUP_THREADS_PER_CLIENT) {
                            match client.release(key, *token) {
                                Ok(true) => {}
                                Ok(false) => tally.count("cleanup-release:not_held".to_owned()),
                                Err(err) => tally.error("cleanup-release", &err),
                            }
                        }
                        tally.errors
                    },
                );
                match spawned {
                    Ok(handle) => handles.push(handle),
                    Err(_) => *errors.entry("cleanup-release:no_thread".to_owned()).or_default() += 1,
                }
            }
        }
        for handle in handles {
            let counts = handle.join().unwrap_or_default();
            for (what, count) in counts {
                *errors.entry(what).or_default() += count;
            }
        }
    });
    errors
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// This process's CPU time (user plus system, all threads) in seconds, from
/// `/proc/self/stat`; `None` where there is no such file.
fn own_cpu_seconds() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    cpu_ticks_of_stat(&text).map(|ticks| ticks as f64 / USER_HZ)
}

/// The unit of `/proc/<pid>/stat`'s times: Linux fixes USER_HZ at 100 on
/// every architecture this runs on.
const USER_HZ: f64 = 100.0;

/// utime plus stime, in clock ticks, from the text of `/proc/<pid>/stat`.
/// The command name (field 2) may hold spaces and parentheses, so fields are
/// counted from the last `)`.
pub fn cpu_ticks_of_stat(text: &str) -> Option<u64> {
    let after_name = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 (utime) and 15 (stime); field 3 (state) is the first here.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_read_after_the_command_name() {
        let stat = "4242 (fencelock (b) x) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 17 0 0 20 0 9 0 1000 \
                    1000000 300 18446744073709551615";
        assert_eq!(cpu_ticks_of_stat(stat), Some(267));
        assert_eq!(cpu_ticks_of_stat("garbage"), None);
        assert_eq!(cpu_ticks_of_stat("1 (x) S 1 2"), None);
    }

    #[test]
    fn the_leader_goes_first() {
        let endpoints: Vec<String> = ["a:1", "b:2", "c:3"].map(String::from).to_vec();
        let leader = Leader { id: 2, addr: "b:2".into(), term: 3 };
        assert_eq!(leader_first(&endpoints, &leader), ["b:2", "a:1", "c:3"].map(String::from).to_vec());
    }
}
