//! The command line: global options and subcommands, parsed by clap.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

/// The exit codes, shown at the end of `fencelock --help`.
pub const EXIT_CODES_HELP: &str = "\
Exit codes:
  0  done
  1  error (cluster unreachable, bad arguments, refused request; `status`:
     no endpoint answered)
  2  not obtained: the lock is held by another owner or the wait timed out;
     also `check` answering no, `release` or `renew` of a lock not held,
     and `status` finding no leader or a leader without a quorum
  3  the lock was lost while CMD ran (`lock` stopped CMD)
  `lock` otherwise exits with CMD's exit code (128+N if CMD died of signal N).";

/// fencelock: take, release and inspect locks in a fencelock cluster.
#[derive(Debug, Parser)]
#[command(name = "fencelock", version, after_help = EXIT_CODES_HELP)]
pub struct Cli {
    /// Client addresses of cluster nodes (host:port), comma-separated.
    #[arg(
        long,
        global = true,
        env = "FENCELOCK_ENDPOINTS",
        value_delimiter = ',',
        default_value = "127.0.0.1:7101"
    )]
    pub endpoints: Vec<String>,

    /// Print one JSON object on stdout instead of plain text.
    #[arg(long, global = true)]
    pub json: bool,

    /// How long one request to one node may take (e.g. 5s, 500ms).
    #[arg(long, global = true, value_parser = humantime::parse_duration, default_value = "5s")]
    pub timeout: Duration,

    /// How long one call may keep retrying other nodes before giving up.
    #[arg(
        long,
        global = true,
        env = "FENCELOCK_RETRY_FOR",
        value_parser = humantime::parse_duration,
        default_value = "30s"
    )]
    pub retry_for: Duration,

    /// Speak TLS, with the certificates in this directory (`ca.crt`, and
    /// `client-<user>.crt`/`.key`); the `cert` commands write there.
    #[arg(long, global = true, env = "FENCELOCK_CERTS_DIR", value_name = "DIR")]
    pub certs_dir: Option<std::path::PathBuf>,

    /// The user to connect as, with --certs-dir.
    #[arg(long, global = true, env = "FENCELOCK_USER", value_name = "NAME")]
    pub user: Option<String>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run CMD while holding KEY: acquire, run, keep renewed, release.
    ///
    /// CMD gets FENCELOCK_KEY and FENCELOCK_TOKEN in its environment. If the
    /// lock is lost while CMD runs, CMD gets SIGTERM, then SIGKILL after
    /// --grace, and fencelock exits with 3.
    Lock(LockArgs),
    /// Acquire KEY and print its fencing token. The lock is not renewed nor
    /// released: it lasts until --ttl runs out or `release` is called.
    Acquire(AcquireArgs),
    /// Release KEY held under --token, or whoever holds it with --force.
    Release(ReleaseArgs),
    /// Renew KEY held under --token for another --ttl.
    Renew(RenewArgs),
    /// Show who holds KEY.
    Get(GetArgs),
    /// Say whether --token holds KEY now.
    Check(CheckArgs),
    /// List held locks whose keys start with PREFIX.
    List(ListArgs),
    /// Ask every endpoint for its view of the cluster.
    ///
    /// The first line sums the cluster up from the leader's own answer
    /// (if no endpoint is the leader, the leader the answers name is asked
    /// too): `leader: ID (ADDR)  reachable: R/N members  quorum: yes|no`,
    /// or `leader: none ...`. One line per endpoint follows (a blank node
    /// still waiting for its peers says `starting (waiting for peers 2,
    /// 3)`), then the members. Exits 1 when no endpoint answers, and 2 when
    /// no leader answers or the leader reaches no quorum of voters.
    Status,
    /// Make the certificates of a cluster: its CA, each node's, each
    /// user's. They go into --certs-dir, where fencelockd and fencelock
    /// look for them.
    #[command(subcommand)]
    Cert(CertCommand),
    /// Back up the lock table: `snapshot save FILE` (restore with
    /// `fencelockd --restore FILE`).
    #[command(subcommand)]
    Snapshot(crate::snapshot::SnapshotCommand),
    /// The cluster's members: `member list`, `member add ID PEER_ADDR
    /// CLIENT_ADDR`, `member remove ID`, `member promote ID`.
    #[command(subcommand)]
    Member(crate::members::MemberCommand),
    /// Leadership: `leader transfer ID`.
    #[command(subcommand)]
    Leader(crate::members::LeaderCommand),
}

// The subcommands' names are the contract (`fencelock cert create-ca`...).
#[allow(clippy::enum_variant_names)]
#[derive(Debug, Subcommand)]
pub enum CertCommand {
    /// Make the cluster's CA: ca.crt, and ca.key (mode 0600; keep it off
    /// the nodes once their certificates are made).
    CreateCa(Overwrite),
    /// Make node N's certificate, node-N.crt and node-N.key, for the host
    /// names and IP addresses it serves under.
    CreateNode {
        #[command(flatten)]
        overwrite: Overwrite,
        #[command(flatten)]
        lifetime: Lifetime,
        /// The node's id, as in fencelockd --id.
        #[arg(long)]
        id: u64,
        /// DNS names and IP addresses clients and peers reach the node by.
        #[arg(required = true, value_name = "HOST")]
        hosts: Vec<String>,
    },
    /// Make user NAME's client certificate, client-NAME.crt and
    /// client-NAME.key.
    CreateClient {
        #[command(flatten)]
        overwrite: Overwrite,
        #[command(flatten)]
        lifetime: Lifetime,
        /// The user name: letters, digits, `.`, `_` and `-`.
        name: String,
    },
}

#[derive(Debug, Args)]
pub struct Overwrite {
    /// Replace files that exist.
    #[arg(long)]
    pub overwrite: bool,
}

#[derive(Debug, Args)]
pub struct Lifetime {
    /// How long the certificate is valid (never past the CA's end).
    /// Connections are closed when it ends.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5years")]
    pub lifetime: Duration,
}

#[derive(Debug, Args)]
pub struct LockArgs {
    pub key: String,
    /// The lease; renewed in the background while CMD runs.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub ttl: Duration,
    /// How long to wait for the lock if another owner holds it.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "30s")]
    pub wait: Duration,
    /// How long CMD may take to stop after SIGTERM before it is killed.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub grace: Duration,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

#[derive(Debug, Args)]
pub struct AcquireArgs {
    pub key: String,
    /// The lease.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// How long to wait for the lock if another owner holds it.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub wait: Duration,
    /// The owner identity; acquiring again with the same owner returns the
    /// same token. Default: a fresh one. Over TLS (--certs-dir) an owner is
    /// the user's: OWNER is taken as USER/OWNER unless it is USER or
    /// already starts with USER/.
    #[arg(long)]
    pub owner: Option<String>,
}

#[derive(Debug, Args)]
pub struct ReleaseArgs {
    pub key: String,
    /// The fencing token the lock is held under.
    #[arg(long, required_unless_present = "force", conflicts_with = "force", value_parser = token_parser())]
    pub token: Option<u64>,
    /// Release whoever holds it.
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct RenewArgs {
    pub key: String,
    #[arg(long, value_parser = token_parser())]
    pub token: u64,
    /// The new lease, from now.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub ttl: Duration,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    pub key: String,
    /// Answer from the node asked, which may be behind the leader.
    #[arg(long)]
    pub stale: bool,
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    pub key: String,
    #[arg(long, value_parser = token_parser())]
    pub token: u64,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    #[arg(default_value = "")]
    pub prefix: String,
    /// The most locks to list; 0 means the server's maximum.
    #[arg(long, default_value_t = 0)]
    pub limit: u32,
}

/// Tokens are never 0, so 0 is a typing mistake worth catching here.
fn token_parser() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("fencelock").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_lists_the_exit_codes() {
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("Exit codes:"), "{help}");
        assert!(help.contains("3  the lock was lost"), "{help}");
        assert!(help.contains("`status` finding no leader"), "{help}");
        let status = Cli::command().find_subcommand_mut("status").unwrap().render_long_help().to_string();
        assert!(status.contains("quorum: yes|no") && status.contains("Exits 1 when"), "{status}");
    }

    #[test]
    fn lock_takes_the_command_after_a_double_dash() {
        let cli = parse(&[
            "--endpoints",
            "a:1,b:2",
            "lock",
            "jobs/x",
            "--ttl",
            "500ms",
            "--",
            "sh",
            "-c",
            "exit 3",
        ])
        .unwrap();
        assert_eq!(cli.endpoints, vec!["a:1".to_owned(), "b:2".to_owned()]);
        let Command::Lock(lock) = cli.command else { panic!("{:?}", cli.command) };
        assert_eq!(lock.key, "jobs/x");
        assert_eq!(lock.ttl, Duration::from_millis(500));
        assert_eq!(lock.wait, Duration::from_secs(30));
        assert_eq!(lock.grace, Duration::from_secs(10));
        assert_eq!(lock.command, vec!["sh", "-c", "exit 3"]);
    }

    #[test]
    fn lock_needs_a_command() {
        assert!(parse(&["lock", "k"]).is_err());
        assert!(parse(&["lock", "k", "--"]).is_err());
    }

    #[test]
    fn global_options_go_anywhere_and_durations_use_humantime() {
        let cli =
            parse(&["acquire", "k", "--ttl", "1m", "--wait", "2s", "--json", "--timeout", "250ms"]).unwrap();
        assert!(cli.json);
        assert_eq!(cli.timeout, Duration::from_millis(250));
        let Command::Acquire(acquire) = cli.command else { panic!("{:?}", cli.command) };
        assert_eq!(
            (acquire.ttl, acquire.wait, acquire.owner),
            (Duration::from_secs(60), Duration::from_secs(2), None)
        );
        assert!(parse(&["acquire", "k", "--ttl", "soon"]).is_err());
        assert!(parse(&["acquire", "k"]).is_err(), "--ttl is required");
    }

    #[test]
    fn release_needs_exactly_one_of_token_and_force() {
        let Command::Release(release) = parse(&["release", "k", "--token", "4"]).unwrap().command else {
            panic!("not a release")
        };
        assert_eq!((release.token, release.force), (Some(4), false));
        let Command::Release(release) = parse(&["release", "k", "--force"]).unwrap().command else {
            panic!("not a release")
        };
        assert_eq!((release.token, release.force), (None, true));
        assert!(parse(&["release", "k"]).is_err());
        assert!(parse(&["release", "k", "--token", "4", "--force"]).is_err());
        assert!(parse(&["release", "k", "--token", "0"]).is_err(), "tokens are never 0");
    }

    #[test]
    fn reads_parse_their_options() {
        let Command::Get(get) = parse(&["get", "k", "--stale"]).unwrap().command else { panic!("not a get") };
        assert!(get.stale);
        let Command::List(list) = parse(&["list"]).unwrap().command else { panic!("not a list") };
        assert_eq!((list.prefix.as_str(), list.limit), ("", 0));
        let Command::List(list) = parse(&["list", "jobs/", "--limit", "5"]).unwrap().command else {
            panic!("not a list")
        };
        assert_eq!((list.prefix.as_str(), list.limit), ("jobs/", 5));
        assert!(matches!(parse(&["status"]).unwrap().command, Command::Status));
        assert!(parse(&["check", "k"]).is_err(), "--token is required");
        assert!(parse(&["renew", "k", "--token", "3"]).is_err(), "--ttl is required");
    }
}
