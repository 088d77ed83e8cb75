//! The subcommands other than `lock`: one call each, printed plain or as
//! JSON.

use anyhow::{Context, Result};
use fencelock_client::{Client, ClientConfig, ClientError, LockInfo, TlsConfig};

use crate::args::{AcquireArgs, CheckArgs, Cli, GetArgs, ListArgs, ReleaseArgs, RenewArgs};
use crate::output::{
    acquire_json, check_json, get_json, human, list_json, release_json, renew_json, status_json, Exit,
};

/// Builds the client from the global options.
pub fn connect(cli: &Cli) -> Result<Client> {
    let mut config = ClientConfig::new(cli.endpoints.iter().cloned());
    config.request_timeout = cli.timeout;
    config.retry_for = cli.retry_for;
    if let Some(certs_dir) = &cli.certs_dir {
        let user = cli.user.clone().context("--certs-dir needs --user NAME (or FENCELOCK_USER)")?;
        config.tls = Some(TlsConfig { certs_dir: certs_dir.clone(), user });
    }
    let what = if config.tls.is_some() { "bad --endpoints or certificates" } else { "bad --endpoints" };
    Client::connect(config).context(what)
}

/// The owner an acquire carries for `--owner OWNER`: over TLS, the user's
/// (`USER/OWNER`, unless OWNER is USER or starts with `USER/`).
fn owner_of(cli: &Cli, owner: &str) -> Vec<u8> {
    match cli.user.as_deref().filter(|_| cli.certs_dir.is_some()) {
        Some(user) if owner != user && !owner.starts_with(&format!("{user}/")) => {
            format!("{user}/{owner}").into_bytes()
        }
        _ => owner.as_bytes().to_vec(),
    }
}

/// Prints `value` as one line of JSON.
pub fn print_json(value: &serde_json::Value) {
    println!("{value}");
}

pub fn acquire(cli: &Cli, args: &AcquireArgs) -> Result<Exit> {
    let client = connect(cli)?;
    let owner = match &args.owner {
        Some(owner) => owner_of(cli, owner),
        None => client.owner().to_vec(),
    };
    // No guard: this process exits right away, and the lock must outlive it.
    let grant = client
        .acquire_raw(&owner, &args.key, args.ttl, args.wait)
        .with_context(|| format!("cannot acquire {}", args.key))?;
    if cli.json {
        print_json(&acquire_json(&args.key, &grant, &owner));
    } else {
        println!("{}", grant.token);
    }
    Ok(Exit::Done)
}

pub fn release(cli: &Cli, args: &ReleaseArgs) -> Result<Exit> {
    let client = connect(cli)?;
    let released = match args.token {
        Some(token) if !args.force => client.release(&args.key, token),
        _ => client.force_release(&args.key),
    }
    .with_context(|| format!("cannot release {}", args.key))?;
    if cli.json {
        print_json(&release_json(&args.key, args.token, args.force, released));
    } else {
        println!("{}", if released { "released" } else { "not held" });
    }
    Ok(if released { Exit::Done } else { Exit::NotObtained })
}

pub fn renew(cli: &Cli, args: &RenewArgs) -> Result<Exit> {
    let client = connect(cli)?;
    let results = client
        .renew(&[(args.key.as_bytes().to_vec(), args.token)], args.ttl)
        .with_context(|| format!("cannot renew {}", args.key))?;
    let renewed = results
        .iter()
        .any(|(key, token, renewed)| key == args.key.as_bytes() && *token == args.token && *renewed);
    if cli.json {
        print_json(&renew_json(&args.key, args.token, args.ttl, renewed));
    } else {
        println!("{}", if renewed { "renewed" } else { "not held" });
    }
    Ok(if renewed { Exit::Done } else { Exit::NotObtained })
}

pub fn get(cli: &Cli, args: &GetArgs) -> Result<Exit> {
    let client = connect(cli)?;
    let holder = client.get(&args.key, !args.stale).with_context(|| format!("cannot get {}", args.key))?;
    if cli.json {
        print_json(&get_json(&args.key, holder.as_ref()));
    } else {
        match holder {
            Some(info) => println!("{}", describe(&info)),
            None => println!("free"),
        }
    }
    Ok(Exit::Done)
}

pub fn check(cli: &Cli, args: &CheckArgs) -> Result<Exit> {
    let client = connect(cli)?;
    let holds = client.check(&args.key, args.token).with_context(|| format!("cannot check {}", args.key))?;
    if cli.json {
        print_json(&check_json(&args.key, args.token, holds));
    } else {
        println!("{}", if holds { "holds" } else { "does not hold" });
    }
    Ok(if holds { Exit::Done } else { Exit::NotObtained })
}

pub fn list(cli: &Cli, args: &ListArgs) -> Result<Exit> {
    let client = connect(cli)?;
    let locks = client.list(&args.prefix, args.limit).context("cannot list locks")?;
    if cli.json {
        print_json(&list_json(&args.prefix, &locks));
    } else {
        for info in &locks {
            println!("{}", describe(info));
        }
    }
    Ok(Exit::Done)
}

/// Asks every endpoint, not just one, so that a split view shows. Exits 1
/// only when no endpoint answers.
pub fn status(cli: &Cli) -> Result<Exit> {
    let client = connect(cli)?;
    let answers: Vec<_> = cli
        .endpoints
        .iter()
        .map(|endpoint| {
            let answer = client.status(endpoint).map_err(|error| match error {
                // One node, not the cluster, failed to answer.
                ClientError::Unavailable(reason) => reason,
                other => other.to_string(),
            });
            (endpoint.clone(), answer)
        })
        .collect();
    if cli.json {
        print_json(&status_json(&answers));
    } else {
        for (endpoint, answer) in &answers {
            match answer {
                Ok(node) => println!(
                    "{endpoint}  id={} role={} term={} leader={} commit={} applied={}{}",
                    node.node_id,
                    node.role,
                    node.term,
                    node.leader_id,
                    node.commit_index,
                    node.applied_index,
                    if node.rejoining {
                        " rejoining (lost its data; not voting until caught up)"
                    } else {
                        ""
                    }
                ),
                Err(error) => println!("{endpoint}  error: {error}"),
            }
        }
        if let Some(first) = answers.iter().find_map(|(_, answer)| answer.as_ref().ok()) {
            if !first.cluster_id.is_empty() {
                println!("cluster: {}", first.cluster_id);
            }
            println!("members:");
            for member in &first.members {
                let client_addr = if member.client_addr.is_empty() { "?" } else { &member.client_addr };
                // Peer addresses are shown to admins only, over TLS.
                let peer_addr = if member.peer_addr.is_empty() { "(admins only)" } else { &member.peer_addr };
                println!("  {}  peer={peer_addr} client={client_addr}", member.id);
            }
        }
    }
    if answers.iter().all(|(_, answer)| answer.is_err()) {
        // The answers are printed already (one JSON object with --json), so
        // only a line on stderr is left to say.
        eprintln!("fencelock: no endpoint answered");
        return Ok(Exit::Failed);
    }
    Ok(Exit::Done)
}

/// One lock on one line: `KEY token=T owner=O lease=10s`.
fn describe(info: &LockInfo) -> String {
    format!(
        "{} token={} owner={} lease={}",
        String::from_utf8_lossy(&info.key),
        info.token,
        String::from_utf8_lossy(&info.owner),
        human(std::time::Duration::from_millis(info.lease_ms))
    )
}
