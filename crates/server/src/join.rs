//! `fencelockd --join ENDPOINTS`: a node with an empty data directory asks
//! a running cluster (any of its client endpoints) to add it as a learner,
//! starts with the members the cluster named, and, once it has caught up,
//! asks to be promoted to voter. A node that already holds data is a
//! member, or was: it starts from its store, and `--join` only promotes it
//! if it is still a learner.
//!
//! Under TLS the calls go as the node itself, with its own certificate:
//! the cluster lets a node's certificate confirm the entry an admin's
//! `fencelock member add` made for it, and promote it, nothing more (so
//! run `member add` first, as it prints this node's start command). With
//! `$FENCELOCK_USER` set, or a `client-admin.crt` in `--certs-dir` (as
//! before nodes could join as themselves), they go as that user, an admin,
//! who may also add the node.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use fencelock_client::{Client, ClientConfig, ClientError, TlsConfig};
use slog::{info, warn, Logger};

use crate::config::ServerConfig;

/// How long a join waits for the cluster to answer, all retries included.
const JOIN_RETRY_FOR: Duration = Duration::from_secs(60);

/// How often a learner asks to be promoted while it catches up.
const PROMOTE_EVERY: Duration = Duration::from_secs(1);

fn client(config: &ServerConfig, endpoints: &[String]) -> Result<Client> {
    let tls = config.certs_dir.as_ref().map(|dir| TlsConfig {
        certs_dir: dir.clone(),
        user: join_user(std::env::var("FENCELOCK_USER").ok(), dir, config.id),
    });
    let client_config = ClientConfig {
        endpoints: endpoints.to_vec(),
        request_timeout: Duration::from_secs(5),
        retry_for: JOIN_RETRY_FOR,
        owner: None,
        tls,
        drift: fencelock_client::Drift::default(),
    };
    Client::connect(client_config).context("--join: cannot make a client for the cluster")
}

/// Whom a join calls as under TLS: `$FENCELOCK_USER` when set, else
/// `admin` when its client certificate is in `certs_dir` (joins before
/// nodes could join as themselves), else the node itself
/// (`node/<id>`, its own certificate).
fn join_user(env_user: Option<String>, certs_dir: &std::path::Path, id: u64) -> String {
    match env_user.filter(|user| !user.is_empty()) {
        Some(user) => user,
        None if fencelock_tls::Layout::new(certs_dir).client_cert("admin").exists() => "admin".into(),
        None => fencelock_tls::node_principal(id),
    }
}

/// What the cluster answered a join.
pub struct Joined {
    /// The members' peer addresses, this node's included.
    pub peers: BTreeMap<u64, String>,
    /// This node is a voter already: it was a member, promoted, and has
    /// lost its data since. It must not start as a new node (it may have
    /// voted in a term it would vote in again): it rejoins, like any node
    /// whose data was lost (docs/ARCHITECTURE.md, "A lost data directory").
    pub voter_already: bool,
}

/// Asks the cluster to add this node as a learner.
pub fn ask_to_join(config: &ServerConfig, endpoints: &[String], logger: &Logger) -> Result<Joined> {
    let client = client(config, endpoints)?;
    info!(logger, "asking the cluster to add this node as a learner"; "endpoints" => ?endpoints,
        "peer_addr" => %config.advertise_peer_addr, "client_addr" => %config.advertise_client_addr);
    let membership = client
        .member_add(config.id, &config.advertise_peer_addr, &config.advertise_client_addr)
        .with_context(|| {
            format!("--join: the cluster at {} did not add node {}", endpoints.join(","), config.id)
        })?;
    let voter_already =
        membership.members.iter().any(|member| member.id == config.id && member.role.starts_with("voter"));
    let mut peers = BTreeMap::new();
    for member in membership.members {
        if member.id == config.id {
            peers.insert(member.id, config.advertise_peer_addr.clone());
        } else if !member.peer_addr.is_empty() {
            peers.insert(member.id, member.peer_addr);
        } else {
            warn!(logger, "the cluster named a member without its peer address"; "member" => member.id);
        }
    }
    if voter_already {
        warn!(logger, "this node is a voter of the cluster already, and its data directory is empty: its data \
                       was lost; it rejoins without a vote until it has caught up"; "members" => ?peers);
    } else {
        info!(logger, "added as a learner"; "members" => ?peers);
    }
    Ok(Joined { peers, voter_already })
}

/// Asks, every [`PROMOTE_EVERY`], for this node to be made a voter, until
/// it is one or `stop` is set. Runs on a thread of its own.
pub fn spawn_promoter(
    config: &ServerConfig,
    endpoints: Vec<String>,
    stop: Arc<AtomicBool>,
    logger: Logger,
) -> Result<()> {
    let client = client(config, &endpoints)?;
    let id = config.id;
    std::thread::Builder::new().name("fencelock-join".into()).spawn(move || {
        let mut asked = 0u64;
        while !stop.load(Ordering::SeqCst) {
            match client.member_promote(id) {
                Ok(_) => {
                    info!(logger, "promoted to voter"; "node_id" => id);
                    return;
                }
                // Refusals that asking again cannot change: the node is not
                // a member (removed), or this identity may not promote.
                Err(err @ (ClientError::InvalidArgument(_) | ClientError::PermissionDenied(_))) => {
                    warn!(logger, "cannot be promoted to voter; promote it with `fencelock member promote`";
                        "node_id" => id, "error" => %err);
                    return;
                }
                // Catching up, another change under way, a leader change,
                // a cluster out of reach for longer than a call retries:
                // ask again.
                Err(err) => {
                    asked += 1;
                    if asked % 10 == 1 {
                        info!(logger, "waiting to be promoted to voter"; "why" => %err);
                    }
                }
            }
            std::thread::sleep(PROMOTE_EVERY);
        }
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::join_user;

    #[test]
    fn a_join_calls_as_the_user_named_else_an_admin_whose_key_is_there_else_the_node_itself() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(join_user(None, dir.path(), 4), "node/4");
        assert_eq!(join_user(Some(String::new()), dir.path(), 4), "node/4");
        assert_eq!(join_user(Some("ops".into()), dir.path(), 4), "ops");
        std::fs::write(dir.path().join("client-admin.crt"), "").unwrap();
        assert_eq!(join_user(None, dir.path(), 4), "admin");
        assert_eq!(join_user(Some("ops".into()), dir.path(), 4), "ops");
    }
}
