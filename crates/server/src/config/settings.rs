//! Every setting of fencelockd, declared once, grouped by concern: its flag,
//! its environment variable, its TOML key, its help, its parser and its
//! default (in [`defaults`]). Also the value types the settings use, as
//! flags and the file give them. How the declaration becomes structs is
//! `layers.rs`'s; how the settings are checked together is `config.rs`'s.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use fencelock_raft::human_ms;
use serde::{Deserialize, Deserializer};

use super::layers::{declare_settings, FileValue};
use crate::access::RuleConfig;

/// The default of every setting that has a fixed one, each named once and
/// used both for the value and for what `--help` shows. The others are
/// worked out from other settings (see their help).
pub mod defaults {
    use super::{InitialClusterState, LogFormat, MsSetting};

    pub const ID: u64 = 1;
    /// This node's peer address when there is no `peers`.
    pub const PEER_ADDR: &str = "127.0.0.1:7001";
    pub const CLIENT_ADDR: &str = "127.0.0.1:7101";
    pub const INITIAL_CLUSTER_STATE: InitialClusterState = InitialClusterState::New;
    pub const SNAPSHOT_INTERVAL_ENTRIES: u64 = 10_000;
    pub const MAX_SNAPSHOT_BYTES: usize = 1 << 31;
    pub const LOG_FORMAT: LogFormat = LogFormat::Text;
    pub const LOG_LEVEL: &str = "info";
    pub const TICK_MS: MsSetting = MsSetting::Millis(50);
    pub const ELECTION_MS: MsSetting = MsSetting::Millis(500);
    pub const HEARTBEAT_MS: MsSetting = MsSetting::Millis(100);
    pub const LEASE_MIN_MS: MsSetting = MsSetting::Millis(2_000);
    pub const LEASE_MAX_MS: MsSetting = MsSetting::Millis(24 * 60 * 60 * 1_000);
    pub const WAIT_MAX_MS: MsSetting = MsSetting::Millis(5 * 60 * 1_000);
    pub const MAX_PENDING_REQUESTS: usize = 65_536;
    pub const MAX_PENDING_ACQUIRES: usize = 32_768;
    pub const MAX_WAITERS_PER_KEY: usize = 4_096;
    pub const MAX_WATCHES: usize = 4_096;
    pub const MAX_WATCHES_PER_CONNECTION: usize = 64;
    pub const WATCH_HISTORY_BYTES: usize = 16 << 20;
    pub const MAX_LOCKS: usize = 1_000_000;
    pub const MAX_LOCKS_PER_OWNER: usize = 100_000;
    pub const MAX_CONNECTIONS: usize = 4_096;
    pub const MAX_CONNECTIONS_PER_ADDRESS: usize = 1_024;
    pub const IDLE_TIMEOUT_MS: MsSetting = MsSetting::Millis(10 * 60 * 1_000);
    pub const MAX_IN_FLIGHT: usize = 4_096;
    pub const MAX_FRAME_BYTES: usize = 1 << 20;
    pub const MAX_INPUT_BYTES: usize = fencelock_net::INPUT_TOTAL_MAX;
    pub const MAX_OUTPUT_BYTES: usize = fencelock_net::OUTPUT_TOTAL_MAX;
}

declare_settings! {
    /// Who this node is, where it and its peers listen, and how it starts
    /// on an empty data directory.
    identity: Identity {
        /// This node's id (1 and up), one of those in --peers.
        #[arg(long, env = "FENCELOCKD_ID")]
        id: Option<u64> = defaults::ID,
        /// Every node's peer address, this node's included: 1=HOST:PORT,2=HOST:PORT,...
        /// HOST is an IP address or a host name (resolved again at every
        /// connection). This node listens on its own.
        #[arg(long, env = "FENCELOCKD_PEERS", value_parser = PeersSetting::from_flag)]
        peers: Option<PeersSetting> = format!("ID={}", defaults::PEER_ADDR),
        /// Where clients connect to this node: IP:PORT or HOST:PORT (resolved
        /// once, at start).
        #[arg(long, env = "FENCELOCKD_CLIENT_ADDR")]
        client_addr: Option<String> = defaults::CLIENT_ADDR,
        /// The address clients are told to reach this node at (leader hints,
        /// `fencelock status`); default: --client-addr. Needed when
        /// --client-addr is 0.0.0.0 or [::].
        #[arg(long, value_name = "HOST:PORT", env = "FENCELOCKD_ADVERTISE_CLIENT_ADDR")]
        advertise_client_addr: Option<String>,
        /// The address other nodes are told to reach this node's peer port at;
        /// default: this node's entry in --peers.
        #[arg(long, value_name = "HOST:PORT", env = "FENCELOCKD_ADVERTISE_PEER_ADDR")]
        advertise_peer_addr: Option<String>,
        /// How a node whose data directory is empty starts: `new` founds the
        /// cluster once a majority of --peers is up and blank; `existing` waits
        /// for every peer, and rejoins a cluster that knows it. Ignored once the
        /// node has data.
        #[arg(long, value_enum, env = "FENCELOCKD_INITIAL_CLUSTER_STATE")]
        initial_cluster_state: Option<InitialClusterState> = defaults::INITIAL_CLUSTER_STATE,
    }

    /// Where this node keeps its raft log and snapshots, and how large they
    /// grow.
    storage: Storage {
        /// Where this node keeps its raft log and snapshots. [default:
        /// $XDG_DATA_HOME/fencelock/node-ID, else ~/.local/share/fencelock/node-ID]
        #[arg(long, env = "FENCELOCKD_DATA_DIR")]
        data_dir: Option<PathBuf>,
        /// Snapshot the lock table and compact the log every this many applied
        /// entries.
        #[arg(long, env = "FENCELOCKD_SNAPSHOT_INTERVAL_ENTRIES")]
        snapshot_interval_entries: Option<u64> = defaults::SNAPSHOT_INTERVAL_ENTRIES,
        /// The largest snapshot this node takes from a leader, in bytes: it must
        /// hold the lock table (about 1,300 bytes a lock with the longest keys
        /// and owners).
        #[arg(long, env = "FENCELOCKD_MAX_SNAPSHOT_BYTES")]
        max_snapshot_bytes: Option<usize> = Bytes(defaults::MAX_SNAPSHOT_BYTES),
    }

    /// What this node tells its operators: logs and metrics.
    observability: Observability {
        /// Log format: text or json.
        #[arg(long, env = "FENCELOCKD_LOG_FORMAT")]
        log_format: Option<LogFormat> = defaults::LOG_FORMAT,
        /// Log level: error, warning, info or debug.
        #[arg(long, env = "FENCELOCKD_LOG_LEVEL")]
        log_level: Option<String> = defaults::LOG_LEVEL,
        /// Serve Prometheus metrics at http://ADDR/metrics, and the probes
        /// /health (200 while the node loop answers) and /ready (200 once it
        /// knows a leader with a quorum and has applied what it knows is
        /// committed; 503 otherwise). Off unless set.
        #[arg(long, env = "FENCELOCKD_METRICS_ADDR")]
        metrics_addr: Option<SocketAddr>,
    }

    /// Raft's clock: the same on every node.
    timing: Timing {
        /// The length of one raft tick: milliseconds, or a duration (50ms,
        /// 1s), like every setting named _ms.
        #[arg(long, env = "FENCELOCKD_TICK_MS", value_parser = MsSetting::from_flag, value_name = "DURATION")]
        tick_ms: Option<MsSetting> = defaults::TICK_MS,
        /// The shortest election timeout (the longest is twice it); a multiple
        /// of the tick.
        #[arg(long, env = "FENCELOCKD_ELECTION_MS", value_parser = MsSetting::from_flag, value_name = "DURATION")]
        election_ms: Option<MsSetting> = defaults::ELECTION_MS,
        /// The leader's heartbeat interval; a multiple of the tick.
        #[arg(long, env = "FENCELOCKD_HEARTBEAT_MS", value_parser = MsSetting::from_flag, value_name = "DURATION")]
        heartbeat_ms: Option<MsSetting> = defaults::HEARTBEAT_MS,
    }

    /// What clients may ask of a lock: how long they hold it, how long they
    /// wait for it, and how long an expired one stays held back.
    leases: Leases {
        /// The shortest lease a client may ask for; at least twice the longest
        /// election timeout.
        #[arg(long, env = "FENCELOCKD_LEASE_MIN_MS", value_parser = MsSetting::from_flag, value_name = "DURATION")]
        lease_min_ms: Option<MsSetting> = defaults::LEASE_MIN_MS,
        /// The longest lease a client may ask for.
        #[arg(long, env = "FENCELOCKD_LEASE_MAX_MS", value_parser = MsSetting::from_flag, value_name = "DURATION")]
        lease_max_ms: Option<MsSetting> = defaults::LEASE_MAX_MS,
        /// The longest an acquire may wait in a key's queue (its wait_ms); a
        /// longer wait is refused.
        #[arg(long, env = "FENCELOCKD_WAIT_MAX_MS", value_parser = MsSetting::from_flag, value_name = "DURATION")]
        wait_max_ms: Option<MsSetting> = defaults::WAIT_MAX_MS,
        /// Lock-delay for keys under PREFIX: a lock whose lease runs out (not
        /// one released) is held back that long, granted to no one, before its
        /// key is free; for resources that cannot check tokens. Repeat the flag
        /// (or separate with commas) for more prefixes; the longest matching
        /// prefix wins, and an empty prefix (`=10s`) covers every key. Give
        /// every node the same rules: the leader's apply. In the file: a
        /// `[lock_delay]` table, `"jobs/" = "10s"`. [default: none]
        #[arg(
            long = "lock-delay",
            env = "FENCELOCKD_LOCK_DELAY",
            value_delimiter = ',',
            value_parser = parse_lock_delay,
            value_name = "PREFIX=DURATION"
        )]
        #[serde(default, deserialize_with = "lock_delay_table")]
        lock_delay: Vec<(String, MsSetting)>,
    }

    /// What the leader holds for clients at once: queued requests, waiters,
    /// watches and locks.
    limits: Limits {
        /// Client requests the leader holds unanswered at once (waiting acquires
        /// included); more are answered UNAVAILABLE.
        #[arg(long, env = "FENCELOCKD_MAX_PENDING_REQUESTS")]
        max_pending_requests: Option<usize> = defaults::MAX_PENDING_REQUESTS,
        /// Of those, acquires; more are answered UNAVAILABLE while renewals,
        /// releases and reads still find room.
        #[arg(long, env = "FENCELOCKD_MAX_PENDING_ACQUIRES")]
        max_pending_acquires: Option<usize> = defaults::MAX_PENDING_ACQUIRES,
        /// Acquires waiting for one key; more are answered RESOURCE_EXHAUSTED.
        #[arg(long, env = "FENCELOCKD_MAX_WAITERS_PER_KEY")]
        max_waiters_per_key: Option<usize> = defaults::MAX_WAITERS_PER_KEY,
        /// Watches waiting for a change on this node; more are answered
        /// RESOURCE_EXHAUSTED.
        #[arg(long, env = "FENCELOCKD_MAX_WATCHES")]
        max_watches: Option<usize> = defaults::MAX_WATCHES,
        /// Watches waiting for a change on one client connection.
        #[arg(long, env = "FENCELOCKD_MAX_WATCHES_PER_CONNECTION")]
        max_watches_per_connection: Option<usize> = defaults::MAX_WATCHES_PER_CONNECTION,
        /// Bytes of recent changes each node keeps for watches; a watch further
        /// behind is answered `compacted`, with the current holders.
        #[arg(long, env = "FENCELOCKD_WATCH_HISTORY_BYTES")]
        watch_history_bytes: Option<usize> = defaults::WATCH_HISTORY_BYTES,
        /// Locks the table may hold; a new lock past it is answered
        /// RESOURCE_EXHAUSTED.
        #[arg(long, env = "FENCELOCKD_MAX_LOCKS")]
        max_locks: Option<usize> = defaults::MAX_LOCKS,
        /// Locks the owners of one identity may hold (the owner up to its first
        /// `/`; with TLS, the user); as above.
        #[arg(long, env = "FENCELOCKD_MAX_LOCKS_PER_OWNER")]
        max_locks_per_owner: Option<usize> = defaults::MAX_LOCKS_PER_OWNER,
    }

    /// What this node serves its client connections: how many, for how
    /// long, and how many bytes they may hold.
    connections: Connections {
        /// Client connections served at once.
        #[arg(long, env = "FENCELOCKD_MAX_CONNECTIONS")]
        max_connections: Option<usize> = defaults::MAX_CONNECTIONS,
        /// Client connections served at once from one IP address.
        #[arg(long, env = "FENCELOCKD_MAX_CONNECTIONS_PER_ADDRESS")]
        max_connections_per_address: Option<usize> = defaults::MAX_CONNECTIONS_PER_ADDRESS,
        /// Close a client connection that has no request in flight and has sent
        /// nothing for this long (0: never).
        #[arg(long, env = "FENCELOCKD_IDLE_TIMEOUT_MS", value_parser = MsSetting::from_flag, value_name = "DURATION")]
        idle_timeout_ms: Option<MsSetting> = defaults::IDLE_TIMEOUT_MS,
        /// Requests in flight on one client connection.
        #[arg(long, env = "FENCELOCKD_MAX_IN_FLIGHT")]
        max_in_flight: Option<usize> = defaults::MAX_IN_FLIGHT,
        /// The largest client frame, in bytes.
        #[arg(long, env = "FENCELOCKD_MAX_FRAME_BYTES")]
        max_frame_bytes: Option<usize> = defaults::MAX_FRAME_BYTES,
        /// Bytes of partial client requests held across every connection; past
        /// it, the connection holding the most is closed.
        #[arg(long, env = "FENCELOCKD_MAX_INPUT_BYTES")]
        max_input_bytes: Option<usize> = Bytes(defaults::MAX_INPUT_BYTES),
        /// Unsent answer bytes across every client connection; past it, the
        /// connection holding the most (a client that does not read) is closed.
        #[arg(long, env = "FENCELOCKD_MAX_OUTPUT_BYTES")]
        max_output_bytes: Option<usize> = Bytes(defaults::MAX_OUTPUT_BYTES),
    }

    /// Who may reach this node and do what: TLS, plain TCP beyond loopback,
    /// and the TLS users' rights (those only in the file).
    security: Security {
        /// Serve both ports over TLS with the certificates in DIR (`ca.crt`,
        /// `node-<id>.crt` and `node-<id>.key`; see `fencelock cert`).
        #[arg(long, value_name = "DIR", env = "FENCELOCKD_CERTS_DIR")]
        certs_dir: Option<PathBuf>,
        /// Serve plain TCP on addresses other than loopback (this node's peer,
        /// client or metrics address). Anyone who can reach them can then act as
        /// a peer or a client: see docs/security.md.
        #[arg(long, env = "FENCELOCKD_INSECURE")]
        #[serde(default)]
        insecure: bool,
        /// TLS users with every right on every key (file only).
        #[arg(skip)]
        admins: Option<Vec<String>>,
        /// Rights of TLS users on key prefixes (file only).
        #[arg(skip)]
        rules: Option<Vec<RuleConfig>>,
    }
}

impl Settings {
    /// The settings of the TOML file at `path`, as a layer.
    pub fn read(path: &Path) -> Result<Settings> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        let file: File =
            toml::from_str(&text).with_context(|| format!("config file {} is not valid", path.display()))?;
        file.into_settings()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum InitialClusterState {
    New,
    Existing,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// The names flags, the file and `--config-check` use.
impl fmt::Display for InitialClusterState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            InitialClusterState::New => "new",
            InitialClusterState::Existing => "existing",
        })
    }
}

impl fmt::Display for LogFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        })
    }
}

/// A duration setting as given: a number of milliseconds, or, in the file,
/// text still to parse (`"500ms"`, `"2s"`, `"24h"`), which is parsed once
/// its key is known so that an error can name it. Flags parse theirs at
/// once (`MsSetting::from_flag`).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum MsSetting {
    Millis(u64),
    Text(String),
}

impl MsSetting {
    /// A flag's or an environment variable's duration.
    pub fn from_flag(text: &str) -> Result<MsSetting, String> {
        parse_ms(text).map(MsSetting::Millis)
    }

    /// The duration in milliseconds; `key` names the setting in the error.
    pub fn ms(&self, key: &str) -> Result<u64> {
        match self {
            MsSetting::Millis(ms) => Ok(*ms),
            MsSetting::Text(text) => parse_ms(text).map_err(|why| anyhow!("{key}: {why}")),
        }
    }
}

/// As `--help` and `--config-check` write a duration: `500ms`, `2s`, `24h`.
impl fmt::Display for MsSetting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MsSetting::Millis(ms) => f.write_str(&human_ms(*ms)),
            MsSetting::Text(text) => f.write_str(text),
        }
    }
}

/// A duration in the file is checked where it is read, used or not.
impl FileValue for MsSetting {
    fn checked(self, key: &str) -> Result<Self> {
        self.ms(key).map(MsSetting::Millis)
    }
}

/// `peers` as given: the flag's text, or in the file that text or a table
/// of id to address.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum PeersSetting {
    Text(String),
    Table(BTreeMap<String, String>),
}

impl PeersSetting {
    /// `--peers` as given: it is checked with the other settings.
    pub fn from_flag(text: &str) -> Result<PeersSetting, String> {
        Ok(PeersSetting::Text(text.to_owned()))
    }
}

/// The values the file gives that are taken as they are: checked later,
/// with the other settings, if they are used.
macro_rules! taken_as_given {
    ($($ty:ty),* $(,)?) => {
        $(impl FileValue for $ty {})*
    };
}

taken_as_given!(
    u64,
    usize,
    bool,
    String,
    PathBuf,
    SocketAddr,
    InitialClusterState,
    LogFormat,
    PeersSetting,
    Vec<String>,
    Vec<RuleConfig>,
    Vec<(String, MsSetting)>,
);

/// A duration setting, as a flag or the environment gives it: a number of
/// milliseconds, or a duration with units (`500ms`, `2s`, `5m`, `24h`).
pub fn parse_ms(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(ms);
    }
    let duration = humantime::parse_duration(text).map_err(|err| {
        format!(
            "`{text}` is not a duration (a number of milliseconds, or one like 500ms, 2s, 5m, 24h): {err}"
        )
    })?;
    u64::try_from(duration.as_millis()).map_err(|_| format!("`{text}` is too long"))
}

/// `PREFIX=DURATION`, a lock-delay rule.
pub fn parse_lock_delay(text: &str) -> Result<(String, MsSetting), String> {
    let (prefix, delay) =
        text.rsplit_once('=').ok_or_else(|| format!("`{text}` is not PREFIX=DURATION (say jobs/=10s)"))?;
    Ok((prefix.to_owned(), MsSetting::from_flag(delay)?))
}

/// A byte count as `--help` shows the largest defaults: `67108864 (64 MiB)`.
struct Bytes(usize);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Bytes(bytes) = *self;
        match bytes {
            0 => write!(f, "0"),
            bytes if bytes % (1 << 30) == 0 => write!(f, "{bytes} ({} GiB)", bytes >> 30),
            bytes if bytes % (1 << 20) == 0 => write!(f, "{bytes} ({} MiB)", bytes >> 20),
            bytes => write!(f, "{bytes}"),
        }
    }
}

/// The file's `[lock_delay]` table, key prefix to delay, as the rules the
/// flag gives (in the order of their prefixes).
fn lock_delay_table<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<(String, MsSetting)>, D::Error> {
    let table = BTreeMap::<String, MsSetting>::deserialize(deserializer)?;
    Ok(table.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use clap::{CommandFactory, Parser};

    use super::*;
    use crate::config::{Flags, ServerConfig};

    /// Every key of the file before its settings were declared by concern
    /// (the old `FileConfig`), in its order.
    const KEYS_BEFORE: [&str; 38] = [
        "id",
        "peers",
        "client_addr",
        "advertise_client_addr",
        "advertise_peer_addr",
        "initial_cluster_state",
        "data_dir",
        "log_format",
        "log_level",
        "tick_ms",
        "election_ms",
        "heartbeat_ms",
        "lease_min_ms",
        "lease_max_ms",
        "wait_max_ms",
        "lock_delay",
        "snapshot_interval_entries",
        "max_pending_requests",
        "max_pending_acquires",
        "max_waiters_per_key",
        "max_watches",
        "max_watches_per_connection",
        "watch_history_bytes",
        "max_locks",
        "max_locks_per_owner",
        "max_connections",
        "max_connections_per_address",
        "idle_timeout_ms",
        "max_in_flight",
        "max_frame_bytes",
        "max_input_bytes",
        "max_output_bytes",
        "max_snapshot_bytes",
        "metrics_addr",
        "certs_dir",
        "insecure",
        "admins",
        "rules",
    ];

    /// A file with every key, none at its default, as `--config-check`
    /// prints it.
    const EVERY_KEY: &str = r#"admins = ["ops"]
advertise_client_addr = "localhost:7201"
advertise_peer_addr = "localhost:7002"
certs_dir = "certs"
client_addr = "127.0.0.1:7201"
data_dir = "/var/lib/fencelock/node-2"
election_ms = "200ms"
heartbeat_ms = "40ms"
id = 2
idle_timeout_ms = "5m"
initial_cluster_state = "existing"
insecure = true
lease_max_ms = "2h"
lease_min_ms = "3s"
log_format = "json"
log_level = "warning"
max_connections = 99
max_connections_per_address = 9
max_frame_bytes = 4096
max_in_flight = 33
max_input_bytes = 100000
max_locks = 77
max_locks_per_owner = 7
max_output_bytes = 200000
max_pending_acquires = 500
max_pending_requests = 1000
max_snapshot_bytes = 3000000
max_waiters_per_key = 50
max_watches = 40
max_watches_per_connection = 4
metrics_addr = "127.0.0.1:9100"
snapshot_interval_entries = 123
tick_ms = "20ms"
wait_max_ms = "1m"
watch_history_bytes = 1000000

[lock_delay]
"" = "500ms"
"jobs/" = "2s"

[peers]
1 = "127.0.0.1:7001"
2 = "127.0.0.1:7002"

[[rules]]
prefixes = ["jobs/"]
rights = ["lock", "read"]
users = ["alice"]
"#;

    fn flags(args: &[&str]) -> Flags {
        Flags::try_parse_from(std::iter::once("fencelockd").chain(args.iter().copied())).unwrap()
    }

    fn load_file(text: &str) -> Result<ServerConfig> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("fencelock.toml");
        std::fs::write(&path, text)?;
        ServerConfig::load(&flags(&["--config", path.to_str().unwrap()]))
    }

    #[test]
    fn every_key_of_the_file_is_still_taken_and_used_and_no_other() {
        let mut before = KEYS_BEFORE.to_vec();
        before.sort_unstable();
        let mut now = Settings::KEYS.to_vec();
        now.sort_unstable();
        assert_eq!(now, before);
        for key in KEYS_BEFORE {
            let given = |line: &str| {
                line.starts_with(&format!("{key} = "))
                    || [format!("[{key}]"), format!("[[{key}]]")].contains(&line.to_owned())
            };
            assert!(EVERY_KEY.lines().any(given), "{key} is not in the file");
        }
        let config = load_file(EVERY_KEY).unwrap();
        assert_eq!(config.to_toml(), EVERY_KEY);
        // What only a flag gives is no key of the file.
        for key in ["config", "config_check", "restore", "join"] {
            let err = load_file(&format!("{key} = \"x\"\n")).map(|_| ()).unwrap_err();
            assert!(format!("{err:#}").contains(&format!("unknown field `{key}`")), "{err:#}");
        }
    }

    #[test]
    fn a_bad_value_in_the_file_is_shown_where_it_is() {
        let err = load_file("id = 2\nmax_locks = \"many\"\n").map(|_| ()).unwrap_err();
        let err = format!("{err:#}");
        assert!(err.contains("line 2, column 13"), "{err}");
        assert!(err.contains("invalid type: string \"many\", expected usize"), "{err}");
        let err = load_file("\n\nmax_lock = 1\n").map(|_| ()).unwrap_err();
        let err = format!("{err:#}");
        assert!(err.contains("line 3, column 1") && err.contains("unknown field `max_lock`"), "{err}");
        // A duration in the file is checked even where a flag overrides it.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fencelock.toml");
        std::fs::write(&path, "tick_ms = \"fast\"\n").unwrap();
        let err = ServerConfig::load(&flags(&["--config", path.to_str().unwrap(), "--tick-ms", "50"]))
            .map(|_| ())
            .unwrap_err();
        assert!(format!("{err:#}").contains("tick_ms: `fast` is not a duration"), "{err:#}");
    }

    #[test]
    fn the_help_shows_each_default_and_it_is_the_value_used() {
        let help = Flags::command().render_help().to_string();
        let printed = ServerConfig::load(&flags(&[])).unwrap().to_toml();
        let mut shown = 0;
        for arg in Flags::command().get_arguments() {
            let id = arg.get_id().as_str();
            let Some(text) = Settings::default_text(id) else { continue };
            shown += 1;
            assert!(help.contains(&format!(". [default: {text}] [env: ")), "{id}: {text}");
            if id == "peers" {
                assert!(printed.contains("[peers]\n1 = \"127.0.0.1:7001\"\n"), "{printed}");
                continue;
            }
            // `67108864 (64 MiB)` is printed `67108864`.
            let value = text.split(" (").next().unwrap_or_default();
            let line = printed.lines().find(|line| line.starts_with(&format!("{id} = "))).unwrap_or_default();
            assert!(
                line == format!("{id} = {value}") || line == format!("{id} = \"{value}\""),
                "{id}: {line}"
            );
        }
        // All but data_dir, the advertised addresses, lock_delay, metrics_addr
        // and the four of TLS and access.
        assert_eq!(shown, 29);
    }

    /// One setting of each concern, with a value for each layer that gives
    /// one: the flag, the environment and the file (as TOML); and what
    /// `--config-check` prints for it from each, then with none.
    struct Precedence {
        flag: &'static str,
        env: &'static str,
        key: &'static str,
        given: [&'static str; 3],
        printed: [&'static str; 4],
    }

    const PRECEDENCE: [Precedence; 8] = [
        Precedence {
            flag: "--client-addr",
            env: "FENCELOCKD_CLIENT_ADDR",
            key: "client_addr",
            given: ["127.0.0.1:7201", "127.0.0.1:7301", "\"127.0.0.1:7401\""],
            printed: ["\"127.0.0.1:7201\"", "\"127.0.0.1:7301\"", "\"127.0.0.1:7401\"", "\"127.0.0.1:7101\""],
        },
        Precedence {
            flag: "--snapshot-interval-entries",
            env: "FENCELOCKD_SNAPSHOT_INTERVAL_ENTRIES",
            key: "snapshot_interval_entries",
            given: ["11", "22", "33"],
            printed: ["11", "22", "33", "10000"],
        },
        Precedence {
            flag: "--log-level",
            env: "FENCELOCKD_LOG_LEVEL",
            key: "log_level",
            given: ["debug", "error", "\"warning\""],
            printed: ["\"debug\"", "\"error\"", "\"warning\"", "\"info\""],
        },
        Precedence {
            flag: "--heartbeat-ms",
            env: "FENCELOCKD_HEARTBEAT_MS",
            key: "heartbeat_ms",
            given: ["150ms", "200", "\"250ms\""],
            printed: ["\"150ms\"", "\"200ms\"", "\"250ms\"", "\"100ms\""],
        },
        Precedence {
            flag: "--wait-max-ms",
            env: "FENCELOCKD_WAIT_MAX_MS",
            key: "wait_max_ms",
            given: ["1m", "120000", "\"3m\""],
            printed: ["\"1m\"", "\"2m\"", "\"3m\"", "\"5m\""],
        },
        Precedence {
            flag: "--max-locks",
            env: "FENCELOCKD_MAX_LOCKS",
            key: "max_locks",
            given: ["11", "22", "33"],
            printed: ["11", "22", "33", "1000000"],
        },
        Precedence {
            flag: "--max-in-flight",
            env: "FENCELOCKD_MAX_IN_FLIGHT",
            key: "max_in_flight",
            given: ["11", "22", "33"],
            printed: ["11", "22", "33", "4096"],
        },
        Precedence {
            flag: "--certs-dir",
            env: "FENCELOCKD_CERTS_DIR",
            key: "certs_dir",
            given: ["flag-certs", "env-certs", "\"file-certs\""],
            printed: ["\"flag-certs\"", "\"env-certs\"", "\"file-certs\"", "(none)"],
        },
    ];

    /// Set in the copy of this test that runs with the environment layer.
    const WITH_ENVIRONMENT: &str = "FENCELOCK_TEST_WITH_ENVIRONMENT";

    /// What `--config-check` would print for each case's key.
    fn printed(args: &[&str]) -> Vec<String> {
        let printed = ServerConfig::load(&flags(args)).unwrap().to_toml();
        PRECEDENCE
            .iter()
            .map(|case| {
                let line = printed.lines().find_map(|line| line.strip_prefix(&format!("{} = ", case.key)));
                line.unwrap_or("(none)").to_owned()
            })
            .collect()
    }

    #[test]
    fn each_concern_takes_a_flag_over_the_environment_over_the_file_over_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fencelock.toml");
        let file: String =
            PRECEDENCE.iter().map(|case| format!("{} = {}\n", case.key, case.given[2])).collect();
        std::fs::write(&path, file).unwrap();
        let config = ["--config", path.to_str().unwrap()];
        let with_flags: Vec<&str> =
            config.into_iter().chain(PRECEDENCE.iter().flat_map(|case| [case.flag, case.given[0]])).collect();
        let expect = |layer: usize| -> Vec<String> {
            PRECEDENCE.iter().map(|case| case.printed[layer].to_owned()).collect()
        };
        if std::env::var_os(WITH_ENVIRONMENT).is_some() {
            assert_eq!(printed(&with_flags), expect(0), "flags over the environment");
            assert_eq!(printed(&config), expect(1), "the environment over the file");
            return;
        }
        for case in &PRECEDENCE {
            assert!(std::env::var_os(case.env).is_none(), "{} is set: unset it to run the tests", case.env);
        }
        assert_eq!(printed(&with_flags), expect(0), "flags over the file");
        assert_eq!(printed(&config), expect(2), "the file over the defaults");
        assert_eq!(printed(&[]), expect(3), "the defaults");
        // The environment is the whole process's: the checks with it run
        // in a copy of this test, alone in a process of its own.
        let module = module_path!().split_once("::").map_or(module_path!(), |(_, module)| module);
        let name = format!(
            "{module}::each_concern_takes_a_flag_over_the_environment_over_the_file_over_the_default"
        );
        let mut child = Command::new(std::env::current_exe().unwrap());
        child.args([name.as_str(), "--exact", "--test-threads=1"]).env(WITH_ENVIRONMENT, "1");
        for case in &PRECEDENCE {
            child.env(case.env, case.given[1]);
        }
        let output = child.output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(output.status.success() && stdout.contains("1 passed"), "{output:?}");
    }
}
