//! TLS for the generator's connections, when `--certs-dir` and `--user`
//! are given: every client (`fencelock-client` for the threads generator
//! and probes, the event loop's own connections) connects as that user.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use anyhow::{Context, Result};
use fencelock_client::{ClientConfig, TlsConfig};

struct Current {
    settings: TlsConfig,
    config: Arc<rustls::ClientConfig>,
}

static CURRENT: OnceLock<Option<Current>> = OnceLock::new();

/// Loads the user's certificates (once, at start), or sets plain TCP.
pub fn init(certs_dir: Option<PathBuf>, user: Option<String>) -> Result<()> {
    let current = match (certs_dir, user) {
        (None, None) => None,
        (Some(certs_dir), Some(user)) => {
            let config = fencelock_tls::client_tls(&fencelock_tls::Layout::new(&certs_dir), &user)
                .context("cannot use the certificates")?;
            Some(Current { settings: TlsConfig { certs_dir, user }, config })
        }
        _ => anyhow::bail!("--certs-dir and --user go together"),
    };
    let _ = CURRENT.set(current);
    Ok(())
}

fn current() -> Option<&'static Current> {
    CURRENT.get().and_then(Option::as_ref)
}

/// A client configuration for `endpoints`, over TLS if set.
pub fn client_config<I, S>(endpoints: I) -> ClientConfig
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut config = ClientConfig::new(endpoints);
    config.tls = current().map(|current| current.settings.clone());
    config
}

/// The rustls configuration of the event loop's connections, if TLS.
pub fn rustls_config() -> Option<Arc<rustls::ClientConfig>> {
    current().map(|current| Arc::clone(&current.config))
}

/// The owner name `name` as the cluster takes it: over TLS an owner is
/// bound to the user (`USER/name`).
pub fn owner(name: &str) -> String {
    match current() {
        Some(current) => format!("{}/{name}", current.settings.user),
        None => name.to_owned(),
    }
}
