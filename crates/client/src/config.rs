//! [`ClientConfig`]: where the cluster is, how long to wait, and who we are.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::sansio::Drift;

/// The default time one attempt (one request to one node) may take.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The default time one call may spend retrying across nodes.
pub const DEFAULT_RETRY_FOR: Duration = Duration::from_secs(30);

/// How a [`Client`](crate::Client) reaches the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientConfig {
    /// Client addresses of the nodes, as `host:port`. Any subset of the
    /// cluster works: a follower points the client at the leader.
    pub endpoints: Vec<String>,
    /// The longest one attempt may take. An acquire that waits gets its wait
    /// on top of this.
    pub request_timeout: Duration,
    /// The longest one call may spend retrying (another node, a new leader)
    /// before it gives up with [`ClientError::Unavailable`](crate::ClientError::Unavailable).
    pub retry_for: Duration,
    /// The owner identity acquires carry. A retried acquire by the same owner
    /// gets the same token back, so retries never grant twice. `None` picks a
    /// fresh identity per client: `<hostname>-<pid>-<nanoseconds since epoch>`,
    /// after `<user>/` over TLS. Over TLS the server takes only owners of the
    /// user: the user name, or `<user>/` and any suffix.
    pub owner: Option<Vec<u8>>,
    /// TLS to every node, as a user of the cluster's CA. `None`: plain TCP.
    pub tls: Option<TlsConfig>,
    /// ρ, the most the client's and the nodes' clocks may drift: a lock
    /// counts as held for `lease × (1 − ρ) / (1 + ρ)` from each grant or
    /// renewal's send time (`docs/leases.md`). Default 1 %.
    pub drift: Drift,
}

/// Where a client finds its certificates (made with `fencelock cert`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsConfig {
    /// The directory with `ca.crt`, `client-<user>.crt` and
    /// `client-<user>.key`.
    pub certs_dir: std::path::PathBuf,
    /// The user to connect as.
    pub user: String,
}

impl ClientConfig {
    /// A configuration with the default timeouts and a fresh owner identity.
    pub fn new<I, S>(endpoints: I) -> ClientConfig
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ClientConfig {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            retry_for: DEFAULT_RETRY_FOR,
            owner: None,
            tls: None,
            drift: Drift::default(),
        }
    }
}

impl ClientConfig {
    /// The owner a client made from this configuration uses: `owner`, or a
    /// fresh identity (after `<user>/` over TLS, as the server requires).
    pub fn owner_or_default(&self) -> Vec<u8> {
        self.owner.clone().unwrap_or_else(|| match &self.tls {
            Some(tls) => [tls.user.as_bytes(), b"/", &default_owner()].concat(),
            None => default_owner(),
        })
    }

    /// The endpoints, trimmed, empty ones left out; an error when none is
    /// left or the owner is empty.
    pub fn checked_endpoints(&self) -> Result<Vec<String>, crate::ClientError> {
        let endpoints: Vec<String> = self
            .endpoints
            .iter()
            .map(|endpoint| endpoint.trim().to_owned())
            .filter(|e| !e.is_empty())
            .collect();
        if endpoints.is_empty() {
            return Err(crate::ClientError::InvalidArgument("no endpoints given".to_owned()));
        }
        if self.owner.as_ref().is_some_and(Vec::is_empty) {
            return Err(crate::ClientError::InvalidArgument("owner is empty".to_owned()));
        }
        Ok(endpoints)
    }

    /// The TLS configuration to every node, as the configured user, or
    /// `None` for plain TCP.
    pub fn rustls(&self) -> Result<Option<std::sync::Arc<rustls::ClientConfig>>, crate::ClientError> {
        match &self.tls {
            Some(tls) => fencelock_tls::client_tls(&fencelock_tls::Layout::new(&tls.certs_dir), &tls.user)
                .map(Some)
                .map_err(|err| crate::ClientError::InvalidArgument(format!("TLS: {err}"))),
            None => Ok(None),
        }
    }
}

/// A process-wide floor for the nanoseconds in default owners, so that two
/// clients created within one clock tick still get different identities.
static LAST_OWNER_NANOS: AtomicU64 = AtomicU64::new(0);

/// `<hostname or "host">-<pid>-<nanoseconds since epoch>`, unique per call
/// within this process.
pub(crate) fn default_owner() -> Vec<u8> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let now = u64::try_from(now).unwrap_or(u64::MAX);
    let previous = LAST_OWNER_NANOS
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |last| Some(now.max(last.saturating_add(1))))
        .unwrap_or(0);
    let nanos = now.max(previous.saturating_add(1));
    format!("{}-{}-{}", hostname(), std::process::id(), nanos).into_bytes()
}

/// A seed for a client's retry jitter: the clock and the process, so that
/// clients started together do not pause in step. Both Rust clients take
/// theirs here; the sans-IO core takes it as an argument.
pub fn jitter_seed() -> u64 {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.subsec_nanos());
    (u64::from(std::process::id()) << 32) ^ u64::from(nanos)
}

fn hostname() -> String {
    let from_file = |path: &str| std::fs::read_to_string(path).ok().map(|text| text.trim().to_owned());
    from_file("/proc/sys/kernel/hostname")
        .or_else(|| from_file("/etc/hostname"))
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|name| {
            name.chars()
                .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
                .collect::<String>()
        })
        .filter(|name| !name.is_empty())
        .map(|name| name.chars().take(64).collect())
        .unwrap_or_else(|| "host".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_gives_the_defaults() {
        let config = ClientConfig::new(["a:1", "b:2"]);
        assert_eq!(config.endpoints, vec!["a:1".to_owned(), "b:2".to_owned()]);
        assert_eq!(config.request_timeout, Duration::from_secs(5));
        assert_eq!(config.retry_for, Duration::from_secs(30));
        assert_eq!(config.owner, None);
    }

    #[test]
    fn default_owners_are_unique_and_name_the_process() {
        let first = String::from_utf8(default_owner()).unwrap();
        let second = String::from_utf8(default_owner()).unwrap();
        assert_ne!(first, second);
        assert!(first.contains(&format!("-{}-", std::process::id())), "{first}");
        assert!(first.len() <= fencelock_types::OWNER_LEN_MAX);
    }
}
