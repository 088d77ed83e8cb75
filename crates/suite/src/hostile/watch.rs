//! What runs beside the attacks and judges them: the well-behaved clients,
//! the lease probes, and the memory sampler, each on threads of its own,
//! each attributing what it sees to the phase (quiet, one attack, catch-up)
//! that was on when it saw it.

use std::collections::BTreeMap;
use std::fs;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fencelock_client::Client;
use serde::Serialize;

/// The phase going on now, as an index into the run's list of phases.
#[derive(Debug, Default)]
pub struct Phase(AtomicUsize);

impl Phase {
    pub fn set(&self, index: usize) {
        self.0.store(index, Ordering::SeqCst);
    }

    pub fn now(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

/// One call of a well-behaved client.
#[derive(Clone, Debug)]
pub struct Call {
    /// The phase when it was invoked.
    pub phase: usize,
    pub acquire: bool,
    /// When it completed.
    pub done: Instant,
    pub latency_us: u64,
    /// The error, when it did not get its answer (an acquire answered
    /// `held` counts as an error: each client's keys are its own).
    pub error: Option<String>,
}

/// How the well-behaved clients behave.
#[derive(Clone, Debug)]
pub struct GoodConfig {
    pub clients: usize,
    pub lease: Duration,
    pub request_timeout: Duration,
    pub retry_for: Duration,
}

/// Starts `config.clients` threads, each its own [`Client`] and owner
/// `good/<i>`, acquiring one of its own four keys with no wait and
/// releasing it, over and over until `stop`.
pub fn spawn_good_clients(
    config: &GoodConfig,
    endpoints: &[String],
    phase: &Arc<Phase>,
    stop: &Arc<AtomicBool>,
) -> Result<Vec<JoinHandle<Vec<Call>>>> {
    let mut threads = Vec::new();
    for index in 0..config.clients {
        let owner = format!("good/{index}");
        let client = good_client(config, endpoints, &owner)?;
        let (phase, stop, lease) = (Arc::clone(phase), Arc::clone(stop), config.lease);
        let thread = std::thread::Builder::new()
            .name(format!("good-{index}"))
            .spawn(move || good_loop(&client, &owner, lease, &phase, &stop))
            .context("cannot start a client thread")?;
        threads.push(thread);
    }
    Ok(threads)
}

/// A client of the kind the good clients use, for one-off checks too.
pub fn good_client(config: &GoodConfig, endpoints: &[String], owner: &str) -> Result<Client> {
    let mut client_config = crate::tls::client_config(endpoints.iter().cloned());
    client_config.request_timeout = config.request_timeout;
    client_config.retry_for = config.retry_for;
    client_config.owner = Some(owner.as_bytes().to_vec());
    Client::connect(client_config).context("cannot make a client")
}

fn good_loop(client: &Client, owner: &str, lease: Duration, phase: &Phase, stop: &AtomicBool) -> Vec<Call> {
    let mut calls = Vec::new();
    let mut round = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let key = format!("{owner}/{}", round % 4);
        round += 1;
        let at = phase.now();
        let start = Instant::now();
        let answer = client.acquire_raw(owner.as_bytes(), &key, lease, Duration::ZERO);
        calls.push(Call {
            phase: at,
            acquire: true,
            done: Instant::now(),
            latency_us: micros(start.elapsed()),
            error: answer.as_ref().err().map(ToString::to_string),
        });
        let Ok(grant) = answer else {
            // A call that gave up has spent its whole budget; the next one
            // may start at once.
            continue;
        };
        let at = phase.now();
        let start = Instant::now();
        let released = client.release(&key, grant.token);
        calls.push(Call {
            phase: at,
            acquire: false,
            done: Instant::now(),
            latency_us: micros(start.elapsed()),
            error: match released {
                Ok(true) => None,
                Ok(false) => Some("not held at its release".to_owned()),
                Err(err) => Some(err.to_string()),
            },
        });
    }
    calls
}

/// One lease probe: a lock taken with `acquire_raw` (nothing renews it),
/// then watched by linearizable `get` until it is gone.
#[derive(Clone, Debug, Serialize)]
pub struct Probe {
    pub phase: usize,
    pub key: String,
    /// The acquire was granted (else nothing was watched).
    pub taken: bool,
    /// From the acquire's invoke to the first `get` that found the key free.
    pub freed_after_ms: Option<u64>,
    /// Why it was not seen free in time, or could not be taken.
    pub error: Option<String>,
}

/// How the probes are taken and how long they may take to go.
#[derive(Clone, Copy, Debug)]
pub struct ProbeConfig {
    pub probers: usize,
    pub lease: Duration,
    /// How long past its lease a probe may still be held.
    pub grace: Duration,
    pub poll: Duration,
    /// Each call's budget: short, so that a leader that does not answer
    /// one `get` is asked again soon.
    pub request_timeout: Duration,
}

/// Starts `config.probers` threads, staggered, each taking a probe lock and
/// watching it go, one after the other, until `stop`.
pub fn spawn_probers(
    config: ProbeConfig,
    good: &GoodConfig,
    endpoints: &[String],
    phase: &Arc<Phase>,
    stop: &Arc<AtomicBool>,
) -> Result<Vec<JoinHandle<Vec<Probe>>>> {
    let mut threads = Vec::new();
    for index in 0..config.probers {
        let owner = format!("probe/{index}");
        let probe_client = GoodConfig {
            request_timeout: config.request_timeout,
            retry_for: config.request_timeout,
            ..good.clone()
        };
        let client = good_client(&probe_client, endpoints, &owner)?;
        let (phase, stop) = (Arc::clone(phase), Arc::clone(stop));
        let offset = config.lease.mul_f64(index as f64 / config.probers as f64);
        let thread = std::thread::Builder::new()
            .name(format!("probe-{index}"))
            .spawn(move || {
                // The stagger, so that some probe is taken in every attack.
                std::thread::sleep(offset);
                let mut probes = Vec::new();
                let mut round = 0;
                while !stop.load(Ordering::SeqCst) {
                    let key = format!("{owner}/{round}");
                    round += 1;
                    probes.push(probe(&client, &owner, &key, config, &phase));
                }
                probes
            })
            .context("cannot start a probe thread")?;
        threads.push(thread);
    }
    Ok(threads)
}

fn probe(client: &Client, owner: &str, key: &str, config: ProbeConfig, phase: &Phase) -> Probe {
    let at = phase.now();
    let mut probe = Probe { phase: at, key: key.to_owned(), taken: false, freed_after_ms: None, error: None };
    if let Err(err) = client.acquire_raw(owner.as_bytes(), key, config.lease, Duration::ZERO) {
        // Not a lease that outlived itself: the good clients' check
        // counts what the cluster did not serve.
        probe.error = Some(format!("could not take it: {err}"));
        std::thread::sleep(config.poll);
        return probe;
    }
    probe.taken = true;
    // The lease runs from when the grant applied, at the latest when its
    // answer came; a linearizable read sent after that plus the lease and
    // the grace must find the lock gone. A read's own wait (the cluster is
    // under attack) does not count against the cluster: what matters is
    // when it was sent.
    let answered = Instant::now();
    let deadline = answered + config.lease + config.grace;
    loop {
        let sent = Instant::now();
        let last = match client.get(key, true) {
            Ok(None) => {
                probe.freed_after_ms = Some(millis(answered.elapsed()));
                return probe;
            }
            Ok(Some(holder)) => format!("still held (token {})", holder.token),
            Err(err) => format!("the cluster did not say ({err})"),
        };
        if sent >= deadline {
            probe.error = Some(format!(
                "a read sent {} ms after the acquire was answered found it {last}",
                millis(sent.duration_since(answered))
            ));
            return probe;
        }
        std::thread::sleep(config.poll);
    }
}

/// The nodes' processes as the sampler reads them: `None` while a node is
/// down on purpose. Whoever kills or starts a node changes its entry while
/// holding the lock, so that a sample never sees a process the suite
/// killed as one that died.
#[derive(Debug, Default)]
pub struct Pids(Mutex<BTreeMap<u64, Option<u32>>>);

impl Pids {
    pub fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u64, Option<u32>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// What the sampler saw.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Memory {
    /// The highest resident set (VmRSS, KiB) per phase and node.
    pub rss_kib: BTreeMap<usize, BTreeMap<u64, u64>>,
    /// The highest VmHWM (peak resident set, KiB) per node, over every
    /// process it ran as.
    pub hwm_kib: BTreeMap<u64, u64>,
    /// Processes that were gone or zombies while the suite counted on them.
    pub deaths: Vec<String>,
    pub samples: u64,
}

/// Samples every node's `/proc/<pid>/status` each `every` until `stop`.
pub fn spawn_sampler(
    pids: &Arc<Pids>,
    phase: &Arc<Phase>,
    stop: &Arc<AtomicBool>,
    every: Duration,
) -> Result<JoinHandle<Memory>> {
    let (pids, phase, stop) = (Arc::clone(pids), Arc::clone(phase), Arc::clone(stop));
    std::thread::Builder::new()
        .name("memory".into())
        .spawn(move || {
            let mut memory = Memory::default();
            while !stop.load(Ordering::SeqCst) {
                sample(&pids, phase.now(), &mut memory);
                // The sampling period, not a wait for a condition.
                std::thread::sleep(every);
            }
            sample(&pids, phase.now(), &mut memory);
            memory
        })
        .context("cannot start the memory sampler")
}

fn sample(pids: &Pids, phase: usize, memory: &mut Memory) {
    let pids = pids.lock();
    memory.samples += 1;
    for (&node, pid) in pids.iter() {
        let Some(pid) = *pid else { continue };
        match ProcStatus::read(pid) {
            Some(status) if !status.zombie => {
                let peak = memory.rss_kib.entry(phase).or_default().entry(node).or_default();
                *peak = (*peak).max(status.rss_kib);
                let hwm = memory.hwm_kib.entry(node).or_default();
                *hwm = (*hwm).max(status.hwm_kib).max(status.rss_kib);
            }
            _ => {
                let death = format!("node {node} (pid {pid}) is gone");
                if !memory.deaths.contains(&death) {
                    memory.deaths.push(death);
                }
            }
        }
    }
}

/// The fields of `/proc/<pid>/status` the sampler needs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcStatus {
    pub rss_kib: u64,
    pub hwm_kib: u64,
    pub zombie: bool,
}

impl ProcStatus {
    /// `None` when the process is gone (reaped, or never was).
    pub fn read(pid: u32) -> Option<ProcStatus> {
        fs::read_to_string(format!("/proc/{pid}/status")).ok().map(|text| ProcStatus::parse(&text))
    }

    pub fn parse(text: &str) -> ProcStatus {
        let mut status = ProcStatus::default();
        for line in text.lines() {
            let Some((name, value)) = line.split_once(':') else { continue };
            let value = value.trim();
            let kib = || value.trim_end_matches("kB").trim().parse::<u64>().unwrap_or(0);
            match name {
                "VmRSS" => status.rss_kib = kib(),
                "VmHWM" => status.hwm_kib = kib(),
                // Exited, not yet reaped: as good as dead.
                "State" => status.zombie = value.starts_with('Z') || value.starts_with('X'),
                _ => {}
            }
        }
        status
    }
}

pub fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}

pub fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_status_reads_rss_peak_and_zombies() {
        let text = "Name:\tfencelockd\nState:\tS (sleeping)\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(ProcStatus::parse(text), ProcStatus { rss_kib: 10_240, hwm_kib: 20_480, zombie: false });
        assert!(ProcStatus::parse("State:\tZ (zombie)\n").zombie);
        let own = ProcStatus::read(std::process::id()).unwrap();
        assert!(own.rss_kib > 0 && own.hwm_kib >= own.rss_kib && !own.zombie);
    }
}
