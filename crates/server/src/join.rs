//! `fencelockd --join ENDPOINTS`: a node with an empty data directory asks
//! a running cluster (any of its client endpoints) to add it as a learner,
//! starts with the members the cluster named, and, once it has caught up,
//! asks to be promoted to voter. A node that already holds data is a
//! member, or was: it starts from its store, and `--join` only promotes it
//! if it is still a learner.
//!
//! Under TLS the calls go as the user `$FENCELOCK_USER` (default `admin`),
//! with `client-<user>.crt` and `.key` from `--certs-dir`: membership is
//! for admins.

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
        user: std::env::var("FENCELOCK_USER").unwrap_or_else(|_| "admin".into()),
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
