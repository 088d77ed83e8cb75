//! fencelockd's configuration: what the server runs with ([`ServerConfig`]),
//! made from the command line, the environment and an optional TOML file,
//! in that order of precedence, then the defaults; checked as a whole
//! before anything starts. Every setting is declared once, by concern, in
//! `config/settings.rs`; `config/layers.rs` turns that declaration into the
//! flags, the file and the layering. This module owns what the settings
//! mean together: the defaults worked out from other settings, every check
//! across them, and the file `--config-check` prints.

mod layers;
mod settings;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use clap::Parser;
use fencelock_raft::rejoin::ClusterState;
use fencelock_raft::{human_ms, Config as DriverConfig, NodeId};
use fencelock_types::LeaseMs;

use crate::access::{Access, RuleConfig};
#[cfg(test)]
use settings::parse_ms;
pub use settings::{defaults, InitialClusterState, LogFormat, PeersSetting, Settings};

/// How long a node with an empty data directory and no other member in
/// its --peers listens for a running cluster before it founds one
/// (`fencelock_raft::Config::founding_grace_ms`): twice the peers' longest
/// reconnection backoff.
const FOUNDING_GRACE_MS: u64 = 2_000;

/// Command-line flags: every setting ([`Settings`], each also from the
/// environment as `FENCELOCKD_` and its name in capitals, and from the TOML
/// file under its name with underscores), and the four that are flags only:
/// `--config`, `--config-check`, `--restore` and `--join`. Flags win over
/// the environment, which wins over the file.
#[derive(Debug, Default, Parser)]
#[command(
    name = "fencelockd",
    version,
    about = "The fencelock server: a replicated lock service with fencing tokens.",
    after_help = "With no flags it runs a single-node service: peers 1=127.0.0.1:7001, clients on \
                  127.0.0.1:7101, data in ~/.local/share/fencelock/node-1 ($XDG_DATA_HOME/fencelock/node-1 if set).\n\nA node whose data directory is empty asks its \
                  peers first: with --initial-cluster-state new (the default) a cluster starts once a majority of \
                  its nodes is up and blank, and a node that lost its data \
                  rejoins without a vote until it has caught up.\n\nSIGHUP reloads the certificates of --certs-dir \
                  (docs/security.md).\n\nExit codes: 0 clean shutdown (SIGINT or \
                  SIGTERM, or --config-check passed); 1 bad configuration or a fatal error; 3 this node was removed \
                  from the cluster (fencelock member remove)."
)]
pub struct Flags {
    #[command(flatten)]
    pub settings: Settings,
    /// A TOML file with any of these settings; flags win over it.
    #[arg(long, env = "FENCELOCKD_CONFIG")]
    pub config: Option<PathBuf>,
    /// Check the configuration, print it with every default as a TOML file
    /// that --config takes, and exit.
    #[arg(long)]
    pub config_check: bool,
    /// Seed a new cluster from a backup (`fencelock snapshot save FILE`):
    /// run every node of the new cluster once with the same FILE and the
    /// same --peers, each on an empty data directory. The cluster starts
    /// with the backup's locks, gets a new cluster id, and issues tokens
    /// above the backup's counter and above its first leader's clock. A
    /// data directory that holds data is refused: drop --restore once the
    /// node has started. Flag only (not in the TOML file).
    #[arg(long, value_name = "FILE", env = "FENCELOCKD_RESTORE")]
    pub restore: Option<PathBuf>,
    /// Join a running cluster: on an empty data directory, ask the cluster
    /// at these client endpoints (HOST:PORT,...) to add this node as a
    /// learner (at --advertise-peer-addr and --advertise-client-addr), then
    /// to promote it to voter once it has caught up. --peers need only name
    /// this node. A node that holds data already starts from it. Flag only.
    #[arg(long, value_name = "ENDPOINTS", env = "FENCELOCKD_JOIN")]
    pub join: Option<String>,
}

/// The checked configuration the server runs with.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    pub id: u64,
    /// Every node's peer address as given (`HOST:PORT`), this one's included.
    pub peers: BTreeMap<u64, String>,
    /// Where this node listens for peers: its own entry, resolved.
    pub peer_listen_addr: SocketAddr,
    /// Where it listens for clients, resolved.
    pub client_addr: SocketAddr,
    /// What clients and peers are told.
    pub advertise_client_addr: String,
    pub advertise_peer_addr: String,
    pub data_dir: PathBuf,
    pub log_format: LogFormat,
    pub log_level: slog::Level,
    pub tick: Duration,
    pub driver: DriverConfig,
    pub max_connections: usize,
    pub max_connections_per_address: usize,
    /// `None`: idle connections stay.
    pub idle_timeout: Option<Duration>,
    pub max_in_flight: usize,
    pub max_frame_bytes: usize,
    pub max_input_bytes: usize,
    pub max_output_bytes: usize,
    pub max_snapshot_bytes: usize,
    /// The longest wait an acquire may ask for.
    pub wait_max_ms: u64,
    /// Where `/metrics` is served; `None`: nowhere.
    pub metrics_addr: Option<SocketAddr>,
    /// TLS on both ports, with the certificates in this directory.
    pub certs_dir: Option<PathBuf>,
    /// What each TLS user may do; `None` without TLS (no users).
    pub access: Option<Access>,
    /// The addresses this node serves plain TCP on that are not loopback
    /// (allowed by `insecure`; the server warns of each at start).
    pub exposed: Vec<(&'static str, SocketAddr)>,
    /// The backup to seed this node's empty store with (`--restore`).
    pub restore: Option<PathBuf>,
    /// The cluster to join (`--join`): client endpoints.
    pub join: Option<Vec<String>>,
    /// Plain TCP allowed beyond loopback.
    pub insecure: bool,
    /// The permissions as configured (with TLS), for `--config-check`.
    pub admins: Vec<String>,
    pub rules: Vec<RuleConfig>,
}

impl ServerConfig {
    /// Builds the configuration from `flags` (and the environment) over
    /// the file they name, over the defaults.
    pub fn load(flags: &Flags) -> Result<ServerConfig> {
        let file = match &flags.config {
            Some(path) => Settings::read(path)?,
            None => Settings::default(),
        };
        ServerConfig::resolve(flags.settings.clone().or(file), flags)
    }

    /// The configuration from the layered `settings` (with the defaults
    /// for what none gives) and the flags-only `flags`, checked.
    fn resolve(settings: Settings, flags: &Flags) -> Result<ServerConfig> {
        let Settings { identity, storage, observability, timing, leases, limits, connections, security } =
            settings;

        let id = identity.id.unwrap_or(defaults::ID);
        let peers = match identity.peers {
            Some(PeersSetting::Text(text)) => parse_peers(&text)?,
            Some(PeersSetting::Table(table)) => peers_from_table(table)?,
            None => parse_peers(&format!("{id}={}", defaults::PEER_ADDR))?,
        };
        let Some(own_peer_text) = peers.get(&id).cloned() else {
            bail!("--id {id} is not among --peers ({})", peers_text(&peers));
        };
        let peer_listen_addr = resolve(&own_peer_text).context("this node's own address in --peers")?;
        let client_text = identity.client_addr.unwrap_or_else(|| defaults::CLIENT_ADDR.to_owned());
        let client_text = host_port(&client_text).context("--client-addr")?;
        let client_addr = resolve(&client_text).context("--client-addr")?;
        let advertise_client_addr = match identity.advertise_client_addr {
            Some(text) => host_port(&text).context("--advertise-client-addr")?,
            None if client_addr.ip().is_unspecified() => bail!(
                "--client-addr {client_text} listens on every interface, and clients cannot be told to reach \
                 it there: pass --advertise-client-addr HOST:PORT, the address clients should use"
            ),
            None => client_text,
        };
        let advertise_peer_addr = match identity.advertise_peer_addr {
            Some(text) => host_port(&text).context("--advertise-peer-addr")?,
            None => own_peer_text,
        };
        let initial_cluster_state = identity.initial_cluster_state.unwrap_or(defaults::INITIAL_CLUSTER_STATE);
        let data_dir = match storage.data_dir {
            Some(dir) => dir,
            None => default_data_dir(id, &|name| std::env::var(name).ok(), Path::new(LEGACY_DATA_DIR))?,
        };
        let log_format = observability.log_format.unwrap_or(defaults::LOG_FORMAT);
        let log_level = parse_level(observability.log_level.as_deref().unwrap_or(defaults::LOG_LEVEL))?;

        let tick_ms = timing.tick_ms.unwrap_or(defaults::TICK_MS).ms("tick_ms")?;
        let election_ms = timing.election_ms.unwrap_or(defaults::ELECTION_MS).ms("election_ms")?;
        let heartbeat_ms = timing.heartbeat_ms.unwrap_or(defaults::HEARTBEAT_MS).ms("heartbeat_ms")?;
        if tick_ms == 0 {
            bail!("tick_ms must be positive");
        }
        for (name, ms) in [("election_ms", election_ms), ("heartbeat_ms", heartbeat_ms)] {
            if ms % tick_ms != 0 || ms == 0 {
                bail!("{name} ({ms}) must be a positive multiple of tick_ms ({tick_ms})");
            }
        }

        let voters = peers.keys().map(|id| NodeId(*id)).collect();
        let mut driver = DriverConfig::new(NodeId(id), voters);
        driver.founding.initial_cluster_state = match initial_cluster_state {
            InitialClusterState::New => ClusterState::New,
            InitialClusterState::Existing => ClusterState::Existing,
        };
        // A node alone in its --peers listens this long before it founds:
        // a running cluster that added it (member add) reconnects within a
        // second (the peers' reconnection backoff) and says so.
        driver.founding.founding_grace_ms = FOUNDING_GRACE_MS;
        driver.raft.election_ticks = (election_ms / tick_ms) as usize;
        driver.raft.heartbeat_ticks = (heartbeat_ms / tick_ms) as usize;
        driver.leases.lease_min_ms =
            leases.lease_min_ms.unwrap_or(defaults::LEASE_MIN_MS).ms("lease_min_ms")?;
        driver.leases.lease_max_ms =
            leases.lease_max_ms.unwrap_or(defaults::LEASE_MAX_MS).ms("lease_max_ms")?;
        let wait_max_ms = leases.wait_max_ms.unwrap_or(defaults::WAIT_MAX_MS).ms("wait_max_ms")?;
        let mut delay_rules = Vec::new();
        for (prefix, delay) in leases.lock_delay {
            let delay_ms = delay.ms(&format!("lock_delay.\"{prefix}\""))?;
            delay_rules.push((prefix, delay_ms));
        }
        driver.leases.lock_delays = lock_delays(delay_rules, driver.leases.lease_max_ms)?;
        driver.raft.snapshot_interval_entries =
            storage.snapshot_interval_entries.unwrap_or(defaults::SNAPSHOT_INTERVAL_ENTRIES);
        let caps = &mut driver.limits;
        caps.pending_requests_max = limits.max_pending_requests.unwrap_or(defaults::MAX_PENDING_REQUESTS);
        caps.pending_acquires_max = limits.max_pending_acquires.unwrap_or(defaults::MAX_PENDING_ACQUIRES);
        caps.waiters_per_key_max = limits.max_waiters_per_key.unwrap_or(defaults::MAX_WAITERS_PER_KEY);
        caps.watches_max = limits.max_watches.unwrap_or(defaults::MAX_WATCHES);
        caps.watches_per_connection_max =
            limits.max_watches_per_connection.unwrap_or(defaults::MAX_WATCHES_PER_CONNECTION);
        caps.watch_history_bytes_max = limits.watch_history_bytes.unwrap_or(defaults::WATCH_HISTORY_BYTES);
        caps.locks_max = limits.max_locks.unwrap_or(defaults::MAX_LOCKS);
        caps.locks_per_identity_max = limits.max_locks_per_owner.unwrap_or(defaults::MAX_LOCKS_PER_OWNER);
        driver.validate_timing(tick_ms).map_err(|err| anyhow!(err))?;

        let max_connections = connections.max_connections.unwrap_or(defaults::MAX_CONNECTIONS);
        let max_in_flight = connections.max_in_flight.unwrap_or(defaults::MAX_IN_FLIGHT);
        let max_frame_bytes = connections.max_frame_bytes.unwrap_or(defaults::MAX_FRAME_BYTES);
        if max_connections == 0 || max_in_flight == 0 || max_frame_bytes < 1024 {
            bail!("max_connections and max_in_flight must be positive, max_frame_bytes at least 1024");
        }
        let max_input_bytes = connections.max_input_bytes.unwrap_or(defaults::MAX_INPUT_BYTES);
        let max_output_bytes = connections.max_output_bytes.unwrap_or(defaults::MAX_OUTPUT_BYTES);
        // One whole frame must fit, or a client sending the largest would
        // always be closed.
        if max_input_bytes < max_frame_bytes || max_output_bytes < max_frame_bytes {
            bail!(
                "max_input_bytes ({max_input_bytes}) and max_output_bytes ({max_output_bytes}) must be at least \
                 max_frame_bytes ({max_frame_bytes})"
            );
        }
        let max_snapshot_bytes = storage.max_snapshot_bytes.unwrap_or(defaults::MAX_SNAPSHOT_BYTES);
        if max_snapshot_bytes < 1 << 20 {
            bail!("max_snapshot_bytes ({max_snapshot_bytes}) must be at least 1048576 (1 MiB)");
        }
        let max_connections_per_address =
            connections.max_connections_per_address.unwrap_or(defaults::MAX_CONNECTIONS_PER_ADDRESS);
        if max_connections_per_address == 0 {
            bail!("max_connections_per_address must be positive");
        }
        let idle_timeout_ms =
            connections.idle_timeout_ms.unwrap_or(defaults::IDLE_TIMEOUT_MS).ms("idle_timeout_ms")?;
        // 0: idle connections stay.
        let idle_timeout = (idle_timeout_ms > 0).then(|| Duration::from_millis(idle_timeout_ms));

        let metrics_addr = observability.metrics_addr;
        if let Some(addr) = metrics_addr {
            if addr == client_addr || addr == peer_listen_addr {
                bail!("metrics_addr {addr} is also this node's client or peer address");
            }
        }
        let certs_dir = security.certs_dir;
        // With TLS, only /metrics is plain.
        let plain = certs_dir.is_none();
        let exposed: Vec<(&'static str, SocketAddr)> = [
            ("peer address", Some(peer_listen_addr).filter(|_| plain)),
            ("client_addr", Some(client_addr).filter(|_| plain)),
            ("metrics_addr", metrics_addr),
        ]
        .into_iter()
        .filter_map(|(name, addr)| addr.filter(|addr| !addr.ip().is_loopback()).map(|addr| (name, addr)))
        .collect();
        let admins = security.admins.clone().unwrap_or_default();
        let rules = security.rules.clone().unwrap_or_default();
        let access = match (&certs_dir, security.admins, security.rules) {
            (Some(_), _, _) => Some(
                Access::new(admins.clone(), rules.clone()).map_err(|err| anyhow!("permissions: {err}"))?,
            ),
            (None, None, None) => None,
            (None, _, _) => bail!(
                "admins and rules need TLS (certs_dir): without certificates there are no users, and every \
                 client may do everything"
            ),
        };
        let insecure = security.insecure;
        if let (Some((name, addr)), false) = (exposed.first(), insecure) {
            let risk = match *name {
                "metrics_addr" => "anyone who reaches it can read this node's metrics, lock counts included",
                _ => "anyone who reaches it could act as a peer or a client",
            };
            bail!(
                "this node's {name} {addr} is not a loopback address: fencelockd serves it as plain TCP without \
                 authentication, so {risk}. Bind to 127.0.0.1, or pass --insecure (insecure = true in the file) \
                 on a network you trust; see docs/security.md"
            );
        }
        let join = match &flags.join {
            None => None,
            Some(text) => {
                let endpoints = text
                    .split(',')
                    .map(|endpoint| host_port(endpoint.trim()).context("--join"))
                    .collect::<Result<Vec<String>>>()?;
                if flags.restore.is_some() {
                    bail!("--join and --restore exclude each other: a restored cluster is a new one");
                }
                Some(endpoints)
            }
        };
        Ok(ServerConfig {
            insecure,
            admins,
            rules,
            certs_dir,
            access,
            exposed,
            id,
            peers,
            peer_listen_addr,
            client_addr,
            advertise_client_addr,
            advertise_peer_addr,
            data_dir,
            log_format,
            log_level,
            tick: Duration::from_millis(tick_ms),
            driver,
            max_connections,
            max_connections_per_address,
            idle_timeout,
            max_in_flight,
            max_frame_bytes,
            max_input_bytes,
            max_output_bytes,
            max_snapshot_bytes,
            wait_max_ms,
            metrics_addr,
            restore: flags.restore.clone(),
            join,
        })
    }
}

impl ServerConfig {
    /// The configuration with every default, as a TOML file `--config`
    /// takes (durations with units). `--restore` and `--join` are flags
    /// only, and not in it.
    pub fn to_toml(&self) -> String {
        use toml::{Table, Value};
        let number = |value: u64| Value::Integer(i64::try_from(value).unwrap_or(i64::MAX));
        let count = |value: usize| number(u64::try_from(value).unwrap_or(u64::MAX));
        let text = |value: String| Value::String(value);
        let tick_ms = u64::try_from(self.tick.as_millis()).unwrap_or(u64::MAX);
        let ticks = |ticks: usize| human_ms(tick_ms.saturating_mul(u64::try_from(ticks).unwrap_or(u64::MAX)));
        let driver = &self.driver;
        let mut table = Table::new();
        let mut put = |key: &str, value: Value| {
            table.insert(key.to_owned(), value);
        };
        put("id", number(self.id));
        let peers: Table = self.peers.iter().map(|(id, addr)| (id.to_string(), text(addr.clone()))).collect();
        put("peers", Value::Table(peers));
        put("client_addr", text(self.client_addr.to_string()));
        put("advertise_client_addr", text(self.advertise_client_addr.clone()));
        put("advertise_peer_addr", text(self.advertise_peer_addr.clone()));
        let state = match driver.founding.initial_cluster_state {
            ClusterState::New => "new",
            ClusterState::Existing => "existing",
        };
        put("initial_cluster_state", text(state.to_owned()));
        put("data_dir", text(self.data_dir.display().to_string()));
        put("log_format", text(self.log_format.to_string()));
        let level = match self.log_level {
            slog::Level::Critical | slog::Level::Error => "error",
            slog::Level::Warning => "warning",
            slog::Level::Info => "info",
            slog::Level::Debug | slog::Level::Trace => "debug",
        };
        put("log_level", text(level.to_owned()));
        put("tick_ms", text(human_ms(tick_ms)));
        put("election_ms", text(ticks(driver.raft.election_ticks)));
        put("heartbeat_ms", text(ticks(driver.raft.heartbeat_ticks)));
        put("lease_min_ms", text(human_ms(driver.leases.lease_min_ms)));
        put("lease_max_ms", text(human_ms(driver.leases.lease_max_ms)));
        put("wait_max_ms", text(human_ms(self.wait_max_ms)));
        let delays: Table = driver
            .leases
            .lock_delays
            .iter()
            .map(|(prefix, delay)| {
                (String::from_utf8_lossy(prefix).into_owned(), text(human_ms(delay.get())))
            })
            .collect();
        put("lock_delay", Value::Table(delays));
        put("snapshot_interval_entries", number(driver.raft.snapshot_interval_entries));
        put("max_pending_requests", count(driver.limits.pending_requests_max));
        put("max_pending_acquires", count(driver.limits.pending_acquires_max));
        put("max_waiters_per_key", count(driver.limits.waiters_per_key_max));
        put("max_watches", count(driver.limits.watches_max));
        put("max_watches_per_connection", count(driver.limits.watches_per_connection_max));
        put("watch_history_bytes", count(driver.limits.watch_history_bytes_max));
        put("max_locks", count(driver.limits.locks_max));
        put("max_locks_per_owner", count(driver.limits.locks_per_identity_max));
        put("max_connections", count(self.max_connections));
        put("max_connections_per_address", count(self.max_connections_per_address));
        let idle = self.idle_timeout.map_or(0, |idle| u64::try_from(idle.as_millis()).unwrap_or(u64::MAX));
        // 0 (never) stays a number: "0s" would read as a duration.
        put("idle_timeout_ms", if idle == 0 { number(0) } else { text(human_ms(idle)) });
        put("max_in_flight", count(self.max_in_flight));
        put("max_frame_bytes", count(self.max_frame_bytes));
        put("max_input_bytes", count(self.max_input_bytes));
        put("max_output_bytes", count(self.max_output_bytes));
        put("max_snapshot_bytes", count(self.max_snapshot_bytes));
        if let Some(addr) = self.metrics_addr {
            put("metrics_addr", text(addr.to_string()));
        }
        if let Some(dir) = &self.certs_dir {
            put("certs_dir", text(dir.display().to_string()));
            put("admins", Value::Array(self.admins.iter().cloned().map(text).collect()));
            if let Ok(rules) = Value::try_from(&self.rules) {
                put("rules", rules);
            }
        }
        put("insecure", Value::Boolean(self.insecure));
        toml::to_string(&table).unwrap_or_else(|err| format!("# cannot print the configuration: {err}\n"))
    }
}

/// Where versions before the seventh session kept a node's data by
/// default: relative to the working directory.
const LEGACY_DATA_DIR: &str = "fencelock-data";

/// Where node `id` keeps its data when no `data_dir` is given: a fixed
/// place per user, `$XDG_DATA_HOME/fencelock/node-<id>` or
/// `~/.local/share/fencelock/node-<id>`, never the working directory (a node
/// started from elsewhere would open an empty store). A `legacy` directory
/// left in the working directory by an earlier version stops the start,
/// rather than being left behind silently.
fn default_data_dir(id: u64, env: &dyn Fn(&str) -> Option<String>, legacy: &Path) -> Result<PathBuf> {
    let absolute = |value: String| Some(PathBuf::from(value)).filter(|path| path.is_absolute());
    let base = env("XDG_DATA_HOME")
        .and_then(absolute)
        .or_else(|| env("HOME").and_then(absolute).map(|home| home.join(".local").join("share")))
        .ok_or_else(|| {
            anyhow!(
                "no data_dir given, and neither XDG_DATA_HOME nor HOME names an absolute directory for it: \
                 pass --data-dir DIR"
            )
        })?;
    let dir = base.join("fencelock").join(format!("node-{id}"));
    if legacy.is_dir() {
        bail!(
            "{} exists in the working directory, where earlier versions kept the data by default; the \
             default is now {}. Pass --data-dir {} to go on with it, or move it there",
            legacy.display(),
            dir.display(),
            legacy.display()
        );
    }
    Ok(dir)
}

/// Parses `1=127.0.0.1:7001,2=node-2.example:7002`.
pub fn parse_peers(text: &str) -> Result<BTreeMap<u64, String>> {
    let mut pairs = Vec::new();
    for part in text.split(',').map(str::trim).filter(|part| !part.is_empty()) {
        let (id, addr) = part.split_once('=').ok_or_else(|| anyhow!("peer `{part}` is not ID=HOST:PORT"))?;
        pairs.push((id.trim().to_owned(), addr.trim().to_owned()));
    }
    peers_from_pairs(pairs)
}

/// The file's `[peers]` table: `1 = "node-1.example:7001"`.
fn peers_from_table(table: BTreeMap<String, String>) -> Result<BTreeMap<u64, String>> {
    peers_from_pairs(table.into_iter().collect())
}

fn peers_from_pairs(pairs: Vec<(String, String)>) -> Result<BTreeMap<u64, String>> {
    let mut peers = BTreeMap::new();
    for (id, addr) in pairs {
        let id: u64 = id.parse().with_context(|| format!("peer id `{id}` is not a number"))?;
        if id == 0 {
            bail!("peer id 0 is reserved");
        }
        let addr = host_port(&addr).with_context(|| format!("peer {id}"))?;
        if peers.insert(id, addr).is_some() {
            bail!("peer id {id} appears twice");
        }
    }
    if peers.is_empty() {
        bail!("--peers names no node");
    }
    Ok(peers)
}

fn peers_text(peers: &BTreeMap<u64, String>) -> String {
    peers.iter().map(|(id, addr)| format!("{id}={addr}")).collect::<Vec<_>>().join(",")
}

/// Checks that `text` is `IP:PORT`, `[IPv6]:PORT` or `HOST:PORT` with a
/// plausible host name, and returns it trimmed.
pub fn host_port(text: &str) -> Result<String> {
    let text = text.trim();
    if text.parse::<SocketAddr>().is_ok() {
        return Ok(text.to_owned());
    }
    let bad = || anyhow!("address `{text}` is not HOST:PORT");
    let (host, port) = text.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_')
    };
    if port == 0 || host.len() > 253 || !host.split('.').all(label_ok) {
        return Err(bad());
    }
    Ok(text.to_owned())
}

/// Resolves `HOST:PORT` to its first address.
fn resolve(text: &str) -> Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    text.to_socket_addrs()
        .with_context(|| format!("cannot resolve `{text}`"))?
        .next()
        .ok_or_else(|| anyhow!("`{text}` resolves to no address"))
}

fn parse_level(text: &str) -> Result<slog::Level> {
    match text {
        "error" => Ok(slog::Level::Error),
        "warning" | "warn" => Ok(slog::Level::Warning),
        "info" => Ok(slog::Level::Info),
        "debug" => Ok(slog::Level::Debug),
        other => bail!("log level `{other}` is not one of error, warning, info, debug"),
    }
}

/// Checks lock-delay rules: each prefix a valid key prefix, each delay
/// from 1 ms to the longest lease a client may ask for (`max_ms`).
fn lock_delays(rules: Vec<(String, u64)>, max_ms: u64) -> Result<Vec<(Vec<u8>, LeaseMs)>> {
    // Each due lease is matched against every rule: a bound keeps that cheap.
    const RULES_MAX: usize = 1_024;
    if rules.len() > RULES_MAX {
        bail!("lock-delay: {} rules, more than the {RULES_MAX} allowed", rules.len());
    }
    let mut checked: Vec<(Vec<u8>, LeaseMs)> = Vec::new();
    for (prefix, delay_ms) in rules {
        if prefix.len() > fencelock_types::KEY_LEN_MAX {
            bail!("lock-delay: the prefix `{prefix}` is longer than a key may be");
        }
        let delay = LeaseMs::new(delay_ms).ok().filter(|delay| delay.get() <= max_ms).ok_or_else(|| {
            anyhow!(
                "lock-delay: {} for `{prefix}` is not a delay from 1ms to {} (the longest lease)",
                human_ms(delay_ms),
                human_ms(max_ms)
            )
        })?;
        if checked.iter().any(|(seen, _)| seen == prefix.as_bytes()) {
            bail!("lock-delay: the prefix `{prefix}` has two rules");
        }
        checked.push((prefix.into_bytes(), delay));
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(args: &[&str]) -> Flags {
        Flags::try_parse_from(std::iter::once("fencelockd").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn durations_take_milliseconds_or_units_in_flags_and_in_the_file() {
        assert_eq!(parse_ms("500"), Ok(500));
        assert_eq!(parse_ms("2s"), Ok(2_000));
        assert_eq!(parse_ms(" 24h "), Ok(86_400_000));
        assert_eq!(parse_ms("1m 30s"), Ok(90_000));
        let error = parse_ms("fast").unwrap_err();
        assert!(error.contains("`fast` is not a duration"), "{error}");
        let config = ServerConfig::load(&flags(&["--election-ms", "1s", "--lease-min-ms", "4s"])).unwrap();
        assert_eq!(config.driver.raft.election_ticks, 20);
        assert_eq!(config.driver.leases.lease_min_ms, 4_000);
        assert!(Flags::try_parse_from(["fencelockd", "--tick-ms", "soon"]).is_err());

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fencelock.toml");
        std::fs::write(&path, "tick_ms = 20\nelection_ms = \"200ms\"\nwait_max_ms = \"1m\"\n").unwrap();
        let config = ServerConfig::load(&flags(&["--config", path.to_str().unwrap()])).unwrap();
        assert_eq!(
            (config.tick, config.driver.raft.election_ticks, config.wait_max_ms),
            (Duration::from_millis(20), 10, 60_000)
        );
        std::fs::write(&path, "election_ms = \"soon\"\n").unwrap();
        let error = ServerConfig::load(&flags(&["--config", path.to_str().unwrap()])).unwrap_err();
        assert!(format!("{error:#}").contains("election_ms: `soon` is not a duration"), "{error:#}");
    }

    #[test]
    fn the_printed_configuration_is_a_file_that_gives_the_same_configuration() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fencelock.toml");
        let rules = "admins = [\"ops\"]\n\n[[rules]]\nusers = [\"alice\"]\nprefixes = [\"jobs/\"]\nrights = [\"lock\", \"read\"]\n";
        std::fs::write(&path, format!("certs_dir = \"certs\"\nmax_locks = 77\nidle_timeout_ms = 0\n{rules}"))
            .unwrap();
        let config = ServerConfig::load(&flags(&[
            "--config",
            path.to_str().unwrap(),
            "--id",
            "2",
            "--peers",
            "1=127.0.0.1:7001,2=127.0.0.1:7002,3=localhost:7003",
            "--tick-ms",
            "20",
            "--election-ms",
            "1s",
            "--lease-min-ms",
            "4s",
            "--log-format",
            "json",
            "--metrics-addr",
            "127.0.0.1:9100",
            "--lock-delay",
            "jobs/=10s,=1s",
        ]))
        .unwrap();
        let printed = config.to_toml();
        assert!(printed.contains("[lock_delay]\n\"\" = \"1s\"\n\"jobs/\" = \"10s\"\n"), "{printed}");
        for line in
            ["election_ms = \"1s\"", "tick_ms = \"20ms\"", "max_locks = 77", "idle_timeout_ms = 0", "id = 2"]
        {
            assert!(printed.lines().any(|printed| printed == line), "{line} missing from\n{printed}");
        }
        let again_path = dir.path().join("printed.toml");
        std::fs::write(&again_path, &printed).unwrap();
        let again = ServerConfig::load(&flags(&["--config", again_path.to_str().unwrap()])).unwrap();
        assert_eq!(again.to_toml(), printed);
        assert!(again.access.unwrap().is_admin("ops"));
        // The defaults too.
        let defaults = ServerConfig::load(&flags(&[])).unwrap().to_toml();
        std::fs::write(&again_path, &defaults).unwrap();
        let again = ServerConfig::load(&flags(&["--config", again_path.to_str().unwrap()])).unwrap();
        assert_eq!(again.to_toml(), defaults);
    }

    #[test]
    fn lock_delay_rules_come_from_flags_or_the_file_and_nonsense_is_refused() {
        let config =
            ServerConfig::load(&flags(&["--lock-delay", "jobs/=10s", "--lock-delay", "=500ms"])).unwrap();
        assert_eq!(config.driver.lock_delay(b"jobs/a").map(LeaseMs::get), Some(10_000));
        assert_eq!(config.driver.lock_delay(b"other").map(LeaseMs::get), Some(500));
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fencelock.toml");
        std::fs::write(&path, "[lock_delay]\n\"jobs/\" = \"2s\"\n\"jobs/slow/\" = 60000\n").unwrap();
        let config = ServerConfig::load(&flags(&["--config", path.to_str().unwrap()])).unwrap();
        assert_eq!(config.driver.lock_delay(b"jobs/slow/x").map(LeaseMs::get), Some(60_000));
        assert_eq!(config.driver.lock_delay(b"jobs/x").map(LeaseMs::get), Some(2_000));
        assert_eq!(config.driver.lock_delay(b"other"), None);
        for (bad, why) in [
            ("jobs/", "is not PREFIX=DURATION"),
            ("jobs/=soon", "is not a duration"),
            ("jobs/=0s", "is not a delay from 1ms"),
            ("jobs/=2d", "is not a delay from 1ms"),
            ("jobs/=1s,jobs/=2s", "has two rules"),
        ] {
            let error = match Flags::try_parse_from(["fencelockd", "--lock-delay", bad]) {
                Err(error) => error.to_string(),
                Ok(flags) => match ServerConfig::load(&flags) {
                    Ok(_) => panic!("{bad} was taken"),
                    Err(error) => format!("{error:#}"),
                },
            };
            assert!(error.contains(why), "{bad}: {error}");
        }
        let many: Vec<String> = (0..1_025).map(|n| format!("k{n}/=1s")).collect();
        let flags = Flags::try_parse_from(["fencelockd", "--lock-delay", &many.join(",")]).unwrap();
        let error = ServerConfig::load(&flags).map(|_| ()).unwrap_err();
        assert!(format!("{error:#}").contains("more than the 1024 allowed"), "{error:#}");
    }

    #[test]
    fn no_flags_is_a_single_local_node() {
        let config = ServerConfig::load(&flags(&[])).unwrap();
        assert_eq!(config.id, 1);
        assert_eq!(config.peers.len(), 1);
        assert_eq!(config.client_addr.to_string(), "127.0.0.1:7101");
        assert!(config.data_dir.is_absolute(), "{}", config.data_dir.display());
        assert!(config.data_dir.ends_with("fencelock/node-1"), "{}", config.data_dir.display());
    }

    #[test]
    fn the_default_data_directory_is_per_user_and_never_the_working_directory() {
        let nowhere = Path::new("/nonexistent/fencelock-data");
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| vars.iter().find(|(key, _)| *key == name).map(|(_, value)| value.to_string())
        };
        let dir = default_data_dir(2, &env(&[("HOME", "/home/ada")]), nowhere).unwrap();
        assert_eq!(dir, PathBuf::from("/home/ada/.local/share/fencelock/node-2"));
        let both = env(&[("HOME", "/home/ada"), ("XDG_DATA_HOME", "/data")]);
        assert_eq!(default_data_dir(1, &both, nowhere).unwrap(), PathBuf::from("/data/fencelock/node-1"));
        // Relative values are not places: they would move with the
        // working directory.
        let relative = env(&[("HOME", "home"), ("XDG_DATA_HOME", "data")]);
        let err = default_data_dir(1, &relative, nowhere).unwrap_err();
        assert!(format!("{err:#}").contains("--data-dir"), "{err:#}");
        assert!(default_data_dir(1, &env(&[]), nowhere).is_err());
        // An earlier version's data in the working directory is not left
        // behind silently.
        let cwd = tempfile::tempdir().unwrap();
        let legacy = cwd.path().join("fencelock-data");
        std::fs::create_dir(&legacy).unwrap();
        let err = default_data_dir(1, &env(&[("HOME", "/home/ada")]), &legacy).unwrap_err();
        assert!(format!("{err:#}").contains("--data-dir"), "{err:#}");
    }

    #[test]
    fn flags_win_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fencelock.toml");
        std::fs::write(&path, "id = 2\npeers = \"1=127.0.0.1:7001,2=127.0.0.1:7002\"\ntick_ms = 20\nelection_ms = 200\nheartbeat_ms = 40\n").unwrap();
        let config = ServerConfig::load(&flags(&["--config", path.to_str().unwrap(), "--id", "1"])).unwrap();
        assert_eq!(config.id, 1);
        assert_eq!(config.peers.len(), 2);
        assert_eq!(config.driver.raft.election_ticks, 10);
        assert_eq!(config.tick, Duration::from_millis(20));
        assert_eq!(config.metrics_addr, None);
        assert_eq!(
            (config.driver.limits.locks_max, config.driver.limits.locks_per_identity_max),
            (1_000_000, 100_000)
        );
        std::fs::write(&path, "max_locks = 10\nmax_locks_per_owner = 3\nmax_pending_acquires = 7\n").unwrap();
        let config =
            ServerConfig::load(&flags(&["--config", path.to_str().unwrap(), "--max-locks", "20"])).unwrap();
        assert_eq!((config.driver.limits.locks_max, config.driver.limits.locks_per_identity_max), (20, 3));
        assert_eq!(config.driver.limits.pending_acquires_max, 7);
        std::fs::write(&path, "metrics_addr = \"127.0.0.1:9100\"\n").unwrap();
        let config = ServerConfig::load(&flags(&["--config", path.to_str().unwrap()])).unwrap();
        assert_eq!(config.metrics_addr, Some("127.0.0.1:9100".parse().unwrap()));
    }

    #[test]
    fn bad_configurations_are_refused_with_a_reason() {
        for (args, needle) in [
            (vec!["--id", "3", "--peers", "1=127.0.0.1:7001"], "not among"),
            (vec!["--peers", "1=nowhere"], "HOST:PORT"),
            (vec!["--peers", "1=127.0.0.1:1,1=127.0.0.1:2"], "twice"),
            (vec!["--lease-min-ms", "100"], "election timeout"),
            (vec!["--election-ms", "75"], "multiple"),
            (vec!["--log-level", "loud"], "log level"),
            (vec!["--metrics-addr", "127.0.0.1:7101"], "metrics_addr"),
            (
                vec!["--client-addr", "0.0.0.0:7101", "--advertise-client-addr", "n1:7101"],
                "not a loopback address",
            ),
            (vec!["--client-addr", "0.0.0.0:7101", "--insecure"], "--advertise-client-addr"),
            (vec!["--peers", "1=bad host:7001"], "not HOST:PORT"),
            (vec!["--peers", "1=localhost:0"], "not HOST:PORT"),
            (vec!["--peers", "1=localhost:7001,2=-:7002"], "peer 2"),
            (vec!["--peers", "1=no-such-host.invalid:7001"], "cannot resolve"),
            (vec!["--client-addr", "localhost"], "not HOST:PORT"),
            (vec!["--advertise-peer-addr", "x y:1"], "--advertise-peer-addr"),
            (vec!["--peers", "1=10.1.2.3:7001"], "peer address 10.1.2.3:7001 is not a loopback"),
            (vec!["--metrics-addr", "[::]:9100"], "--insecure"),
            (vec!["--max-locks", "0"], "max_locks must be positive"),
            (vec!["--max-output-bytes", "1000"], "must be at least max_frame_bytes"),
            (vec!["--max-waiters-per-key", "0"], "max_waiters_per_key must be positive"),
        ] {
            let err = ServerConfig::load(&flags(&args)).unwrap_err();
            assert!(format!("{err:#}").contains(needle), "{args:?}: {err:#}");
        }
    }

    #[test]
    fn plain_tcp_beyond_loopback_needs_insecure_and_other_nodes_addresses_do_not_count() {
        let args =
            ["--client-addr", "0.0.0.0:7101", "--insecure", "--advertise-client-addr", "n1.example:7101"];
        let config = ServerConfig::load(&flags(&args)).unwrap();
        assert_eq!(config.advertise_client_addr, "n1.example:7101");
        assert_eq!(config.exposed, vec![("client_addr", "0.0.0.0:7101".parse().unwrap())]);
        // Other nodes' peer addresses are where this one connects, not binds.
        let config = ServerConfig::load(&flags(&["--peers", "1=127.0.0.1:7001,2=10.1.2.3:7002"])).unwrap();
        assert!(config.exposed.is_empty());
        let config = ServerConfig::load(&flags(&["--client-addr", "127.0.0.2:7101"])).unwrap();
        assert!(config.exposed.is_empty());
        // TLS ports may bind anywhere; /metrics stays plain.
        let args = [
            "--client-addr",
            "0.0.0.0:7101",
            "--advertise-client-addr",
            "n1:7101",
            "--peers",
            "1=10.1.2.3:7001",
            "--certs-dir",
            "certs",
        ];
        let config = ServerConfig::load(&flags(&args)).unwrap();
        assert!(config.exposed.is_empty());
        assert!(
            ServerConfig::load(&flags(&["--certs-dir", "certs", "--metrics-addr", "0.0.0.0:9100"])).is_err()
        );
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fencelock.toml");
        std::fs::write(
            &path,
            "client_addr = \"0.0.0.0:7101\"\nadvertise_client_addr = \"n1:7101\"\ninsecure = true\n",
        )
        .unwrap();
        assert!(ServerConfig::load(&flags(&["--config", path.to_str().unwrap()])).is_ok());
    }

    #[test]
    fn host_names_advertised_addresses_and_the_initial_cluster_state() {
        let args = ["--id", "2", "--peers", "1=localhost:7001,2=localhost:7002,3=n3.example:7003"];
        let config = ServerConfig::load(&flags(&args)).unwrap();
        assert_eq!(config.peers[&3], "n3.example:7003", "kept as given, resolved at each connection");
        assert!(config.peer_listen_addr.ip().is_loopback() && config.peer_listen_addr.port() == 7002);
        assert_eq!(config.advertise_peer_addr, "localhost:7002");
        assert_eq!(config.advertise_client_addr, "127.0.0.1:7101");
        assert_eq!(config.driver.founding.initial_cluster_state, ClusterState::New);
        let args = ["--client-addr", "localhost:7201", "--initial-cluster-state", "existing"];
        let config = ServerConfig::load(&flags(&args)).unwrap();
        assert_eq!(config.advertise_client_addr, "localhost:7201");
        assert!(config.client_addr.ip().is_loopback());
        assert_eq!(config.driver.founding.initial_cluster_state, ClusterState::Existing);
        let args = ["--advertise-peer-addr", "[::1]:7001", "--advertise-client-addr", "lb.example:443"];
        let config = ServerConfig::load(&flags(&args)).unwrap();
        assert_eq!(
            (config.advertise_peer_addr.as_str(), config.advertise_client_addr.as_str()),
            ("[::1]:7001", "lb.example:443")
        );
        // In the file, peers may be a table.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fencelock.toml");
        let text = "id = 3\ninitial_cluster_state = \"existing\"\n[peers]\n1 = \"localhost:7001\"\n3 = \"127.0.0.1:7003\"\n";
        std::fs::write(&path, text).unwrap();
        let config = ServerConfig::load(&flags(&["--config", path.to_str().unwrap()])).unwrap();
        assert_eq!(config.peers.len(), 2);
        assert_eq!(config.peers[&1], "localhost:7001");
        assert_eq!(config.driver.founding.initial_cluster_state, ClusterState::Existing);
        std::fs::write(&path, "[peers]\nfirst = \"localhost:7001\"\n").unwrap();
        let err = ServerConfig::load(&flags(&["--config", path.to_str().unwrap()])).unwrap_err();
        assert!(format!("{err:#}").contains("not a number"), "{err:#}");
        assert!(Flags::try_parse_from(["fencelockd", "--initial-cluster-state", "maybe"]).is_err());
    }

    #[test]
    fn permissions_come_from_the_file_and_need_tls() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fencelock.toml");
        let rules = "admins = [\"ops\"]\n\n[[rules]]\nusers = [\"alice\"]\nprefixes = [\"jobs/\"]\nrights = [\"lock\", \"read\"]\n";
        std::fs::write(&path, format!("certs_dir = \"certs\"\n{rules}")).unwrap();
        let config = ServerConfig::load(&flags(&["--config", path.to_str().unwrap()])).unwrap();
        let access = config.access.unwrap();
        assert!(access.allows("alice", crate::access::Right::Lock, b"jobs/x"));
        assert!(!access.allows("alice", crate::access::Right::Lock, b"other"));
        assert!(access.is_admin("ops"));
        // TLS without rules: the defaults.
        let config = ServerConfig::load(&flags(&["--certs-dir", "certs"])).unwrap();
        assert!(config.access.unwrap().allows("anyone", crate::access::Right::Lock, b"k"));
        assert!(ServerConfig::load(&flags(&[])).unwrap().access.is_none());
        for (text, needle) in [
            (rules.to_owned(), "need TLS"),
            ("certs_dir = \"c\"\nadmins = [\"no spaces\"]\n".to_owned(), "permissions: admins"),
            (
                "certs_dir = \"c\"\n[[rules]]\nusers = [\"a\"]\nprefixes = [\"\"]\nrights = [\"write\"]\n"
                    .to_owned(),
                "not valid",
            ),
            (
                "certs_dir = \"c\"\n[[rules]]\nusers = [\"a\"]\nprefixes = []\nrights = [\"read\"]\n"
                    .to_owned(),
                "rules[0]",
            ),
        ] {
            std::fs::write(&path, &text).unwrap();
            let err = ServerConfig::load(&flags(&["--config", path.to_str().unwrap()])).unwrap_err();
            assert!(format!("{err:#}").contains(needle), "{text}: {err:#}");
        }
    }

    #[test]
    fn a_garbage_config_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.toml");
        std::fs::write(&path, "this is = = not toml").unwrap();
        assert!(ServerConfig::load(&flags(&["--config", path.to_str().unwrap()])).is_err());
        std::fs::write(&path, "unknown_setting = 1").unwrap();
        assert!(ServerConfig::load(&flags(&["--config", path.to_str().unwrap()])).is_err());
    }
}
