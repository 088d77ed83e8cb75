//! Whether the suite's clusters speak TLS, and the client settings that go
//! with it: every client of the suite (workload, monitor, probes) is made
//! with [`client_config`], which adds the current cluster's certificates.

use std::sync::{PoisonError, RwLock};

use fencelock_client::{ClientConfig, TlsConfig};

/// The current cluster's certificates, set when it starts.
static CURRENT: RwLock<Option<TlsConfig>> = RwLock::new(None);

/// Sets the certificates clients use from now on (`None`: plain TCP).
pub fn set(tls: Option<TlsConfig>) {
    *CURRENT.write().unwrap_or_else(PoisonError::into_inner) = tls;
}

/// A client configuration for `endpoints`, over TLS if the cluster is.
pub fn client_config<I, S>(endpoints: I) -> ClientConfig
where
    I: IntoIterator<Item = S>,
    S: Into<String>,
{
    let mut config = ClientConfig::new(endpoints);
    config.tls = CURRENT.read().unwrap_or_else(PoisonError::into_inner).clone();
    config
}

/// The owner name `name` as this cluster takes it: over TLS an owner is
/// bound to the user (`USER/name`), as the server requires.
pub fn owner(name: &str) -> String {
    match CURRENT.read().unwrap_or_else(PoisonError::into_inner).as_ref() {
        Some(tls) => format!("{}/{name}", tls.user),
        None => name.to_owned(),
    }
}
