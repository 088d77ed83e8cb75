//! The command line: global options and subcommands, parsed by clap.

use std::path::PathBuf;
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
  4  no such session: `session keepalive` or `session close` of a session
     that is not open (closed, or it lapsed and everything it held was
     freed), or `acquire --session` under one
  `lock` otherwise exits with CMD's exit code (128+N if CMD died of signal N);
  `lock --conflict-exit-code N` and `--lost-exit-code N` replace its 2 and 3,
  so that they cannot be taken for CMD's own.";

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
        default_value = "127.0.0.1:7101",
        value_parser = parse_endpoint
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
    /// CMD gets FENCELOCK_KEY and FENCELOCK_TOKEN in its environment and
    /// runs in a process group of its own. If the lock is lost while CMD
    /// runs, or fencelock is killed, the whole group gets SIGTERM, then
    /// SIGKILL after --grace, and fencelock exits with 3
    /// (--lost-exit-code). What CMD leaves running in its group is stopped
    /// before the release.
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
    Snapshot(SnapshotCommand),
    /// The cluster's members: `member list`, `member add ID PEER_ADDR
    /// CLIENT_ADDR`, `member remove ID`, `member promote ID`.
    #[command(subcommand)]
    Member(MemberCommand),
    /// Leadership: `leader transfer ID`.
    #[command(subcommand)]
    Leader(LeaderCommand),
    /// Run CMD while this process leads election NAME: campaign (FIFO,
    /// waiting as long as it takes, or --wait), run, keep the lead renewed,
    /// resign when CMD ends.
    ///
    /// As `lock` does: CMD gets FENCELOCK_KEY (NAME) and FENCELOCK_TOKEN,
    /// runs in a process group of its own, and is stopped (SIGTERM, then
    /// SIGKILL after --grace) if the lead is lost or fencelock is killed;
    /// fencelock then exits with 3 (--lost-exit-code). Observers see
    /// --value while this process leads.
    Elect(ElectArgs),
    /// Print who leads election NAME, then each new leader and value as
    /// they change (one line, or one JSON object with --json, each), until
    /// stopped. With --once, print the leader now and exit (2: none).
    Observe(ObserveArgs),
    /// The leader of election NAME (under --token) says a new value.
    Proclaim(ProclaimArgs),
    /// Sessions: `session open --ttl 10s` prints a session's id; locks
    /// taken with `acquire --session ID` live as long as it does, and one
    /// `session keepalive ID` (or `--every 3s`) renews them all; `session
    /// close ID` releases them all at once. A session that is not kept
    /// alive within its TTL lapses, and everything it held is freed.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Print the holders of the keys under PREFIX, then each change
    /// (granted, released, expired, delayed, delay_lifted, proclaimed) in
    /// log order with its log index, until stopped. --from INDEX resumes
    /// after an index printed before.
    Watch(WatchArgs),
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Open a session and print its id. Nothing keeps it alive: run
    /// `session keepalive ID` within every --ttl (`--every`), or it
    /// lapses.
    Open(SessionOpenArgs),
    /// Renew session ID for another TTL, from now, and with it everything
    /// held under it. Exits 4 if the session is not open any more.
    Keepalive(SessionKeepaliveArgs),
    /// Close session ID: everything held under it is released at once.
    /// Exits 4 if it was not open.
    Close(SessionIdArgs),
}

#[derive(Debug, Args)]
pub struct SessionOpenArgs {
    /// The session's time to live: each keep-alive renews it for this
    /// long (within the cluster's lease bounds).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub ttl: Duration,
    /// The owner identity, as `acquire --owner`: acquires under the
    /// session must carry the same one. Default: USER@HOST.
    #[arg(long, env = "FENCELOCK_OWNER")]
    pub owner: Option<String>,
}

#[derive(Debug, Args)]
pub struct SessionKeepaliveArgs {
    /// The session's id, as `session open` printed it.
    #[arg(value_parser = token_parser())]
    pub id: u64,
    /// Keep it alive every DURATION (a third of its TTL is a good
    /// choice) until the session is gone (exit 4) or fencelock is stopped,
    /// instead of once.
    #[arg(long, value_name = "DURATION", value_parser = positive_duration)]
    pub every: Option<Duration>,
}

#[derive(Debug, Args)]
pub struct SessionIdArgs {
    /// The session's id, as `session open` printed it.
    #[arg(value_parser = token_parser())]
    pub id: u64,
}

// The subcommands' names are the contract (`fencelock cert create-ca`...).
#[allow(clippy::enum_variant_names)]
#[derive(Debug, Subcommand)]
pub enum CertCommand {
    /// Make the cluster's CA: ca.crt, and ca.key (mode 0600; keep it off
    /// the nodes once their certificates are made).
    CreateCa {
        #[command(flatten)]
        overwrite: Overwrite,
        /// The cluster the CA's certificates name (lowercase letters,
        /// digits, `.`, `_`, `-`); one drawn from the CA's key by default.
        /// A node takes as peers only certificates that name its cluster.
        #[arg(long, value_name = "NAME")]
        cluster: Option<String>,
    },
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
        /// The cluster the certificate names, when not the CA's (a CA that
        /// serves several clusters).
        #[arg(long, value_name = "NAME")]
        cluster: Option<String>,
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
        /// The cluster the certificate names, when not the CA's (a CA that
        /// serves several clusters).
        #[arg(long, value_name = "NAME")]
        cluster: Option<String>,
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
    /// How long CMD may take to stop after SIGTERM before it is killed
    /// [default: a third of --ttl, so that a stopped CMD is gone well
    /// before another holder can be granted the lock].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub grace: Option<Duration>,
    /// Exit with N, not 2, when the lock is not obtained (held by another
    /// owner, or the wait timed out), as flock's -E does.
    #[arg(long, value_name = "N", default_value_t = crate::output::EXIT_NOT_OBTAINED)]
    pub conflict_exit_code: u8,
    /// Exit with N, not 3, when the lock is lost while CMD runs.
    #[arg(long, value_name = "N", default_value_t = crate::output::EXIT_LOST)]
    pub lost_exit_code: u8,
    /// Write the JSON result to FILE. Without it, --json writes the result
    /// to stderr: stdout is CMD's alone.
    #[arg(long, value_name = "FILE")]
    pub json_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub share: ShareArgs,
    /// The command to run, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// How `lock` and `acquire` hold their key: alone (the default), or as a
/// reader, the writer, or one permit of a semaphore.
#[derive(Clone, Copy, Debug, Default, Args)]
pub struct ShareArgs {
    /// Hold KEY as one of its readers: a read-write lock, shared with
    /// other readers, never with a writer.
    #[arg(long, conflicts_with_all = ["write", "permits"])]
    pub read: bool,
    /// Hold KEY as its one writer: a read-write lock, shared with no one.
    /// Waiting writers are not passed by readers that come after them.
    #[arg(long, conflicts_with = "permits")]
    pub write: bool,
    /// Hold one of N permits of the semaphore KEY (N is fixed by the key's
    /// first acquire; asking with another N is an error).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub permits: Option<u32>,
}

impl ShareArgs {
    /// The share asked for; `None`: a plain lock.
    pub fn share(&self) -> Option<fencelock_client::Share> {
        match (self.read, self.write, self.permits) {
            (true, _, _) => Some(fencelock_client::Share::Read),
            (_, true, _) => Some(fencelock_client::Share::Write),
            (_, _, Some(permits)) => Some(fencelock_client::Share::Permit(permits)),
            _ => None,
        }
    }
}

#[derive(Debug, Args)]
pub struct AcquireArgs {
    pub key: String,
    /// The lease (not with --session, whose TTL is the lock's).
    #[arg(long, value_parser = humantime::parse_duration, required_unless_present = "session", conflicts_with = "session")]
    pub ttl: Option<Duration>,
    /// How long to wait for the lock if another owner holds it.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub wait: Duration,
    /// The owner identity; acquiring again with the same owner returns the
    /// same token, so a retried `acquire` gets the lock it may already
    /// have. Default: USER@HOST (the login name and the host name), the
    /// same on every run; set it per job when two jobs of one user on one
    /// host must not share a lock. Over TLS (--certs-dir) an owner is the
    /// user's: OWNER is taken as USER/OWNER unless it is USER or already
    /// starts with USER/.
    #[arg(long, env = "FENCELOCK_OWNER")]
    pub owner: Option<String>,
    /// What the holder says of itself (shown by get, list, watch), up to
    /// 4 KiB. Plain locks only.
    #[arg(long, default_value = "", conflicts_with_all = ["read", "write", "permits"])]
    pub value: String,
    #[command(flatten)]
    pub share: ShareArgs,
    /// Hold KEY under session ID (`session open`) instead of a lease of
    /// its own: it lives as long as the session, and is released with it.
    /// --owner must be the session's. Exits 4 if the session is not open.
    #[arg(long, value_name = "ID", value_parser = token_parser())]
    pub session: Option<u64>,
}

#[derive(Debug, Args)]
pub struct ElectArgs {
    /// The election: a key, like a lock's.
    pub name: String,
    /// What this candidate says of itself while it leads (its address,
    /// say), up to 4 KiB.
    #[arg(long, default_value = "")]
    pub value: String,
    /// The lease of the lead; renewed in the background while CMD runs.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub ttl: Duration,
    /// How long to campaign before giving up (exit 2) [default: as long as
    /// it takes].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub wait: Option<Duration>,
    /// As `lock --grace` [default: a third of --ttl].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub grace: Option<Duration>,
    /// Exit with N, not 2, when --wait runs out before this process leads.
    #[arg(long, value_name = "N", default_value_t = crate::output::EXIT_NOT_OBTAINED)]
    pub conflict_exit_code: u8,
    /// Exit with N, not 3, when the lead is lost while CMD runs.
    #[arg(long, value_name = "N", default_value_t = crate::output::EXIT_LOST)]
    pub lost_exit_code: u8,
    /// As `lock --json-file`.
    #[arg(long, value_name = "FILE")]
    pub json_file: Option<std::path::PathBuf>,
    /// The command to run while leading, after `--`.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

impl ElectArgs {
    /// The `lock` this election runs as (its wait is the campaign's).
    pub fn as_lock(&self) -> LockArgs {
        LockArgs {
            key: self.name.clone(),
            ttl: self.ttl,
            wait: self.wait.unwrap_or(Duration::MAX),
            grace: self.grace,
            conflict_exit_code: self.conflict_exit_code,
            lost_exit_code: self.lost_exit_code,
            json_file: self.json_file.clone(),
            share: ShareArgs::default(),
            command: self.command.clone(),
        }
    }
}

#[derive(Debug, Args)]
pub struct ObserveArgs {
    pub name: String,
    /// Print the leader now and exit: 0 with a leader, 2 without.
    #[arg(long)]
    pub once: bool,
}

#[derive(Debug, Args)]
pub struct ProclaimArgs {
    pub name: String,
    /// The leader's fencing token (FENCELOCK_TOKEN in `elect`'s CMD).
    #[arg(long, env = "FENCELOCK_TOKEN", value_parser = token_parser())]
    pub token: u64,
    /// The new value, up to 4 KiB.
    pub value: String,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    #[arg(default_value = "")]
    pub prefix: String,
    /// Resume after this log index (one printed before) instead of
    /// starting with the holders now.
    #[arg(long, value_name = "INDEX")]
    pub from: Option<u64>,
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

/// A duration above zero (`--every`: a loop with no pause is a mistake).
fn positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(duration) if duration.is_zero() => Err("must be more than 0".to_owned()),
        Ok(duration) => Ok(duration),
        Err(err) => Err(err.to_string()),
    }
}

/// Tokens are never 0, so 0 is a typing mistake worth catching here.
fn token_parser() -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..)
}

impl LockArgs {
    /// `--grace`, or a third of the lease.
    pub fn grace(&self) -> Duration {
        self.grace.unwrap_or(self.ttl / 3)
    }
}

/// One endpoint, HOST:PORT: a host name, an IPv4 address or an IPv6
/// address in brackets, then a port from 1 to 65535. Checked when the
/// arguments are parsed, so that a typo fails at once instead of being
/// retried for --retry-for.
pub fn parse_endpoint(text: &str) -> Result<String, String> {
    let text = text.trim();
    let bad = |why: &str| format!("`{text}` is not HOST:PORT: {why}");
    let (host, port) = text.rsplit_once(':').ok_or_else(|| bad("no port"))?;
    match port.parse::<u16>() {
        Ok(port) if port > 0 => {}
        _ => return Err(bad("the port is not a number from 1 to 65535")),
    }
    if let Some(inner) = host.strip_prefix('[').and_then(|host| host.strip_suffix(']')) {
        if inner.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(bad("not an IPv6 address between the brackets"));
        }
    } else if host.parse::<std::net::Ipv4Addr>().is_err() && !is_host_name(host) {
        return Err(bad(
            "the host is neither a host name nor an IP address (an IPv6 address goes in brackets)",
        ));
    }
    Ok(text.to_owned())
}

/// Letters, digits and `-` in dot-separated labels of 1 to 63 characters,
/// none starting or ending with `-`; 253 characters at most.
fn is_host_name(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'-')
        })
}

// `fencelock member`, `leader` and `snapshot` (run in members.rs and
// snapshot.rs).

#[derive(Debug, Subcommand)]
pub enum MemberCommand {
    /// List the members: id, role (voter or learner), peer and client
    /// addresses. With --json: {"members": [...], "index": N}.
    List,
    /// Add node ID as a learner: it takes the log but does not vote until
    /// promoted. Start it with `fencelockd --id ID --join ENDPOINTS`, which
    /// also adds it (this command is for adding it ahead).
    Add(AddArgs),
    /// Remove node ID, voter or learner. Removing the leader hands
    /// leadership over first. The removed node stops (exit code 3).
    Remove(IdArg),
    /// Make learner ID a voter, once it has caught up (retried until then,
    /// within --retry-for).
    Promote(IdArg),
}

#[derive(Debug, Args)]
pub struct AddArgs {
    /// The new node's id (never reuse a removed node's).
    pub id: u64,
    /// HOST:PORT where peers reach it.
    pub peer_addr: String,
    /// HOST:PORT where clients reach it.
    pub client_addr: String,
}

#[derive(Debug, Args)]
pub struct IdArg {
    /// The node's id.
    pub id: u64,
}

#[derive(Debug, Subcommand)]
pub enum LeaderCommand {
    /// Hand leadership to voter ID; prints the new leader once it leads.
    Transfer(IdArg),
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Save a consistent copy of the lock table, with its token counter,
    /// from the leader to FILE: every lock acknowledged before the command
    /// started is in it. `fencelockd --restore FILE` starts a new cluster
    /// from it.
    ///
    /// Prints `saved FILE: N locks, last token T, index I, B bytes`
    /// (with --json: one object with file, locks, last_token, index and
    /// bytes). FILE is written whole or not at all.
    Save(SaveArgs),
}

#[derive(Debug, Args)]
pub struct SaveArgs {
    /// Where to write the backup.
    pub file: PathBuf,
    /// Replace FILE if it exists.
    #[arg(long)]
    pub force: bool,
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("fencelock").chain(args.iter().copied()))
    }

    #[test]
    fn endpoints_are_checked_when_parsed() {
        for good in ["127.0.0.1:7101", "lock-1.example.com:7101", "localhost:1", "[::1]:7101", " h:65535"] {
            assert_eq!(parse_endpoint(good), Ok(good.trim().to_owned()), "{good}");
        }
        for (bad, why) in [
            ("127.0.0.1", "no port"),
            ("h:0", "the port"),
            ("h:65536", "the port"),
            ("h:71o1", "the port"),
            (":7101", "neither a host name"),
            ("::1:7101", "neither a host name"),
            ("[::g]:7101", "IPv6"),
            ("bad_host:7101", "neither a host name"),
            ("-h:7101", "neither a host name"),
            ("a..b:7101", "neither a host name"),
            ("", "no port"),
        ] {
            let error = parse_endpoint(bad).unwrap_err();
            assert!(error.contains(why) && error.contains(&format!("`{}`", bad.trim())), "{bad}: {error}");
        }
        let long = format!("{}:1", "a".repeat(64));
        assert!(parse_endpoint(&long).is_err());
        // Through clap: each of the comma-separated endpoints, a trailing
        // comma included.
        assert!(parse(&["--endpoints", "a:1,b:2", "status"]).is_ok());
        let error = parse(&["--endpoints", "a:1,b", "status"]).unwrap_err().to_string();
        assert!(error.contains("`b` is not HOST:PORT: no port"), "{error}");
        assert!(parse(&["--endpoints", "a:1,", "status"]).is_err());
    }

    #[test]
    fn lock_grace_defaults_to_a_third_of_the_lease_and_exit_codes_can_be_chosen() {
        let Command::Lock(lock) = parse(&["lock", "k", "--", "true"]).unwrap().command else { panic!() };
        assert_eq!(lock.grace(), Duration::from_secs(10) / 3);
        assert_eq!((lock.conflict_exit_code, lock.lost_exit_code, lock.json_file), (2, 3, None));
        let Command::Lock(lock) = parse(&[
            "lock",
            "k",
            "--ttl",
            "30s",
            "--conflict-exit-code",
            "75",
            "--lost-exit-code",
            "76",
            "--json-file",
            "out.json",
            "--",
            "true",
        ])
        .unwrap()
        .command
        else {
            panic!()
        };
        assert_eq!(lock.grace(), Duration::from_secs(10));
        assert_eq!((lock.conflict_exit_code, lock.lost_exit_code), (75, 76));
        assert_eq!(lock.json_file.as_deref(), Some(std::path::Path::new("out.json")));
        let Command::Lock(lock) = parse(&["lock", "k", "--grace", "1s", "--", "true"]).unwrap().command
        else {
            panic!()
        };
        assert_eq!(lock.grace(), Duration::from_secs(1));
        assert!(parse(&["lock", "k", "--lost-exit-code", "256", "--", "true"]).is_err());
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
        assert_eq!(lock.grace(), Duration::from_millis(500) / 3);
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
            (acquire.ttl, acquire.wait, acquire.owner, acquire.session),
            (Some(Duration::from_secs(60)), Duration::from_secs(2), None, None)
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

    #[test]
    fn sessions_parse_their_options() {
        let Command::Session(SessionCommand::Open(open)) =
            parse(&["session", "open", "--ttl", "10s", "--owner", "w"]).unwrap().command
        else {
            panic!("not a session open")
        };
        assert_eq!((open.ttl, open.owner.as_deref()), (Duration::from_secs(10), Some("w")));
        assert!(parse(&["session", "open"]).is_err(), "--ttl is required");
        let Command::Session(SessionCommand::Keepalive(keep)) =
            parse(&["session", "keepalive", "12"]).unwrap().command
        else {
            panic!("not a keepalive")
        };
        assert_eq!((keep.id, keep.every), (12, None));
        let Command::Session(SessionCommand::Keepalive(keep)) =
            parse(&["session", "keepalive", "12", "--every", "3s"]).unwrap().command
        else {
            panic!("not a keepalive")
        };
        assert_eq!(keep.every, Some(Duration::from_secs(3)));
        assert!(parse(&["session", "keepalive", "12", "--every", "0s"]).is_err());
        assert!(parse(&["session", "keepalive", "0"]).is_err(), "ids are never 0");
        assert!(parse(&["session", "keepalive"]).is_err());
        let Command::Session(SessionCommand::Close(close)) =
            parse(&["session", "close", "12"]).unwrap().command
        else {
            panic!("not a close")
        };
        assert_eq!(close.id, 12);
    }

    #[test]
    fn acquire_takes_a_session_instead_of_a_ttl() {
        let Command::Acquire(acquire) =
            parse(&["acquire", "k", "--session", "12", "--read"]).unwrap().command
        else {
            panic!("not an acquire")
        };
        assert_eq!((acquire.session, acquire.ttl), (Some(12), None));
        assert!(acquire.share.read);
        assert!(
            parse(&["acquire", "k", "--session", "12", "--ttl", "5s"]).is_err(),
            "the TTL is the session's"
        );
        assert!(parse(&["acquire", "k", "--session", "0"]).is_err());
        assert!(parse(&["acquire", "k", "--session", "12", "--value", "v", "--wait", "1s"]).is_ok());
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("4  no such session"), "{help}");
    }
}
