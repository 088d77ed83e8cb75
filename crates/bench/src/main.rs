//! fencelock-bench: the load generator of `cargo xtask bench`.
//!
//! It drives a running cluster with N client connections, from one event
//! loop speaking the protocol (the lock workloads, by default) or through
//! `fencelock-client` with one thread per connection (`--generator threads`,
//! and the renew workload), and prints what it measured as one JSON
//! document on stdout (progress goes to stderr). `cargo xtask bench` starts
//! the cluster, runs this once per workload and renders the table; it can
//! also be pointed at any cluster by hand:
//!
//! ```text
//! fencelock-bench ready --endpoints 127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103
//! fencelock-bench run --endpoints ... --workload distinct --clients 64 --duration 10s
//! fencelock-bench run --endpoints ... --workload hot-key --clients 64 --lease 10s --wait 10s
//! fencelock-bench run --endpoints ... --workload renew --clients 8 --locks 10000 --lease 60s
//! fencelock-bench fsync --dir /path/on/the/servers/disk
//! fencelock-bench wakeup
//! ```
//!
//! A benchmark measures; it never fails on a figure. It fails only when it
//! cannot run (no leader, a lock it must take for setup is refused).

mod events;
mod fsync;
mod order;
mod report;
mod tally;
mod tls;
mod wakeup;
mod workloads;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand};
use serde::Serialize;

use crate::workloads::{Generator, Settings, Workload};

#[derive(Debug, Parser)]
#[command(
    name = "fencelock-bench",
    about = "Load generator for a fencelock cluster: prints its measurements as JSON on stdout."
)]
struct Cli {
    /// Connect over TLS with the certificates in DIR, as --user.
    #[arg(long, global = true, value_name = "DIR")]
    certs_dir: Option<PathBuf>,
    /// The user to connect as, with --certs-dir.
    #[arg(long, global = true, value_name = "NAME")]
    user: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Times `sync_data` after each small append to a file in DIR.
    Fsync {
        /// A directory on the file system the servers' data lives on.
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 1_000)]
        count: usize,
        /// Bytes appended before each sync.
        #[arg(long, default_value_t = 4_096)]
        bytes: usize,
    },
    /// Times one byte's round trip between two threads over loopback TCP:
    /// what the machine charges for waking a thread blocked on a socket.
    Wakeup {
        #[arg(long, default_value_t = 2_000)]
        count: usize,
    },
    /// Waits until every node names the same leader and it grants a probe lock.
    Ready {
        /// Client addresses of every node, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        endpoints: Vec<String>,
        #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
        timeout: Duration,
    },
    /// Runs one workload and prints its report.
    Run(RunArgs),
}

#[derive(Debug, Args)]
struct RunArgs {
    /// Client addresses of every node, comma-separated.
    #[arg(long, value_delimiter = ',', required = true)]
    endpoints: Vec<String>,
    #[arg(long, value_enum)]
    workload: Workload,
    /// Client connections, each with one request in flight.
    #[arg(long, default_value_t = 1)]
    clients: usize,
    /// distinct and hot-key: drive the connections from one event loop
    /// (`events`), or one `fencelock-client` and thread each (`threads`).
    /// renew always uses threads.
    #[arg(long, value_enum, default_value = "events")]
    generator: Generator,
    /// How long to measure, after the warm-up.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    duration: Duration,
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    warmup: Duration,
    /// The lease of every acquire and renewal (within the servers' bounds,
    /// 2 s to 24 h by default).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    lease: Duration,
    /// hot-key: how long an acquire waits in the leader's queue.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    wait: Duration,
    /// renew: locks held in all, spread over the clients.
    #[arg(long, default_value_t = 10_000)]
    locks: usize,
    /// renew: locks per renew request; 0 renews each client's locks in one.
    #[arg(long, default_value_t = 0)]
    renew_batch: usize,
    /// The prefix of every key the run touches (default: bench/<pid>).
    #[arg(long)]
    key_prefix: Option<String>,
    /// hot-key: also write every grant (client, token, and when the acquire
    /// was sent, the grant arrived and the release was sent, in ns) to this
    /// CSV file, for a closer look at the order.
    #[arg(long)]
    grants_csv: Option<PathBuf>,
}

/// The most client threads a run starts: far above the workloads', low
/// enough that a typo does not exhaust the machine's threads.
const CLIENTS_MAX: usize = 4_096;

impl RunArgs {
    fn settings(self) -> Result<Settings> {
        if self.clients == 0 || self.clients > CLIENTS_MAX {
            bail!("--clients must be 1 to {CLIENTS_MAX}, not {}", self.clients);
        }
        if self.duration.is_zero() {
            bail!("--duration must be positive");
        }
        if self.endpoints.iter().any(|endpoint| endpoint.trim().is_empty()) {
            bail!("--endpoints has an empty entry");
        }
        Ok(Settings {
            endpoints: self.endpoints.iter().map(|endpoint| endpoint.trim().to_owned()).collect(),
            clients: self.clients,
            warmup: self.warmup,
            duration: self.duration,
            lease: self.lease,
            wait: self.wait,
            locks: self.locks,
            renew_batch: self.renew_batch,
            key_prefix: self.key_prefix.unwrap_or_else(|| format!("bench/{}", std::process::id())),
            grants_csv: self.grants_csv,
            generator: self.generator,
        })
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("fencelock-bench: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    tls::init(cli.certs_dir, cli.user)?;
    match cli.command {
        Command::Fsync { dir, count, bytes } => print_json(&fsync::measure(&dir, count, bytes)?),
        Command::Wakeup { count } => print_json(&wakeup::measure(count)?),
        Command::Ready { endpoints, timeout } => print_json(&workloads::ready(&endpoints, timeout)?),
        Command::Run(args) => {
            let workload = args.workload;
            print_json(&workloads::run(workload, &args.settings()?)?)
        }
    }
}

/// One JSON document on one line: xtask reads stdout whole.
fn print_json(value: &impl Serialize) -> Result<()> {
    println!("{}", serde_json::to_string(value)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("fencelock-bench").chain(args.iter().copied()))
    }

    #[test]
    fn run_flags_become_settings() {
        let cli = parse(&[
            "run",
            "--endpoints",
            "127.0.0.1:1, 127.0.0.1:2",
            "--workload",
            "hot-key",
            "--clients",
            "64",
            "--duration",
            "3s",
            "--wait",
            "500ms",
            "--key-prefix",
            "k",
        ])
        .unwrap();
        let Command::Run(args) = cli.command else { panic!("not a run: {cli:?}") };
        assert_eq!(args.workload, Workload::HotKey);
        let settings = args.settings().unwrap();
        assert_eq!(settings.endpoints, ["127.0.0.1:1", "127.0.0.1:2"]);
        assert_eq!(settings.clients, 64);
        assert_eq!(settings.duration, Duration::from_secs(3));
        assert_eq!(settings.warmup, Duration::from_secs(1));
        assert_eq!(settings.lease, Duration::from_secs(30));
        assert_eq!(settings.wait, Duration::from_millis(500));
        assert_eq!(settings.locks, 10_000);
        assert_eq!(settings.key_prefix, "k");
        assert_eq!(settings.generator, Generator::Events);
        let cli = parse(&["run", "--endpoints", "a:1", "--workload", "distinct", "--generator", "threads"])
            .unwrap();
        let Command::Run(args) = cli.command else { panic!("not a run: {cli:?}") };
        assert_eq!(args.settings().unwrap().generator, Generator::Threads);
    }

    #[test]
    fn bad_runs_are_refused_before_anything_starts() {
        assert!(parse(&["run", "--workload", "distinct"]).is_err(), "endpoints are required");
        assert!(parse(&["run", "--endpoints", "a:1", "--workload", "everything"]).is_err());
        assert!(parse(&["run", "--endpoints", "a:1", "--workload", "renew", "--duration", "soon"]).is_err());
        for clients in ["0", "100000"] {
            let cli = parse(&["run", "--endpoints", "a:1", "--workload", "distinct", "--clients", clients])
                .unwrap();
            let Command::Run(args) = cli.command else { panic!("not a run") };
            assert!(args.settings().is_err(), "{clients} clients");
        }
    }

    #[test]
    fn fsync_and_ready_have_defaults() {
        let cli = parse(&["fsync", "--dir", "/tmp"]).unwrap();
        assert!(matches!(cli.command, Command::Fsync { count: 1_000, bytes: 4_096, .. }));
        let cli = parse(&["ready", "--endpoints", "a:1,b:2"]).unwrap();
        let Command::Ready { endpoints, timeout } = cli.command else { panic!("not ready") };
        assert_eq!(endpoints, ["a:1", "b:2"]);
        assert_eq!(timeout, Duration::from_secs(30));
    }
}
