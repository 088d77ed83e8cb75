//! The subcommands other than `lock`: one call each, printed plain or as
//! JSON.

use anyhow::{Context, Result};
use fencelock_client::{
    Client, ClientConfig, ClientError, LockInfo, NodeStatus, Released, ShareKind, TlsConfig,
};

use crate::args::{
    AcquireArgs, CheckArgs, Cli, GetArgs, ListArgs, ReleaseArgs, RenewArgs, SessionCommand, SessionIdArgs,
    SessionKeepaliveArgs, SessionOpenArgs,
};
use crate::output::{
    acquire_in_json, acquire_json, check_json, get_json, human, list_json, release_json, renew_json,
    session_close_json, session_keepalive_json, session_open_json, status_json, status_notes, Exit, Summary,
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
    let client = Client::connect(config).context(what)?;
    // Retrying is said on stderr after about a second, not waited out in
    // silence for --retry-for.
    client.on_retrying(|retrying| {
        eprintln!(
            "fencelock: no answer yet after {}, still trying for {} (--retry-for): {}",
            human(round_to_seconds(retrying.elapsed)),
            human(round_to_seconds(retrying.left)),
            retrying.last_error
        );
    });
    Ok(client)
}

fn round_to_seconds(duration: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_secs(u64::try_from((duration.as_millis() + 500) / 1_000).unwrap_or(u64::MAX))
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

/// `acquire`'s owner without `--owner` or `FENCELOCK_OWNER`: USER@HOST,
/// the same on every run, so that a retried `acquire` is answered with the
/// lock it may have got already (same token) rather than "held".
fn default_owner() -> String {
    let uid = nix::unistd::getuid();
    let user = std::env::var("USER")
        .ok()
        .filter(|user| !user.is_empty())
        .or_else(|| nix::unistd::User::from_uid(uid).ok().flatten().map(|user| user.name))
        .unwrap_or_else(|| format!("uid-{uid}"));
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|host| host.into_string().ok())
        .filter(|host| !host.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{user}@{host}")
}

/// Prints `value` as one line of JSON.
pub fn print_json(value: &serde_json::Value) {
    println!("{value}");
}

pub fn acquire(cli: &Cli, args: &AcquireArgs) -> Result<Exit> {
    let client = connect(cli)?;
    let owner = owner_of(cli, &args.owner.clone().unwrap_or_else(default_owner));
    // No guard: this process exits right away, and the lock must outlive it.
    let (key, value, wait) = (&args.key, args.value.as_bytes(), args.wait);
    let grant = match (args.session, args.ttl) {
        (Some(session), _) => match args.share.share() {
            Some(share) => client.acquire_shared_raw_in(session, &owner, key, share, wait),
            None => client.acquire_raw_with_value_in(session, &owner, key, value, wait),
        }
        .with_context(|| format!("cannot acquire {key} under session {session}"))?,
        (None, Some(ttl)) => match args.share.share() {
            Some(share) => client.acquire_shared_raw(&owner, key, share, ttl, wait),
            None => client.acquire_raw_with_value(&owner, key, value, ttl, wait),
        }
        .with_context(|| format!("cannot acquire {key}"))?,
        (None, None) => anyhow::bail!("acquire needs --ttl or --session"),
    };
    if cli.json {
        match args.session {
            Some(session) => print_json(&acquire_in_json(key, &grant, &owner, session)),
            None => print_json(&acquire_json(key, &grant, &owner)),
        }
    } else {
        println!("{}", grant.token);
    }
    Ok(Exit::Done)
}

pub fn release(cli: &Cli, args: &ReleaseArgs) -> Result<Exit> {
    let client = connect(cli)?;
    let outcome = match args.token {
        Some(token) if !args.force => client.release_outcome(&args.key, token),
        _ => client.force_release(&args.key).map(|released| Released { released, holder_token: None }),
    }
    .with_context(|| format!("cannot release {}", args.key))?;
    if cli.json {
        print_json(&release_json(&args.key, args.token, args.force, outcome));
    } else if outcome.released {
        println!("released");
    } else {
        println!("{}", not_held(outcome.holder_token));
    }
    Ok(if outcome.released { Exit::Done } else { Exit::NotObtained })
}

pub fn renew(cli: &Cli, args: &RenewArgs) -> Result<Exit> {
    let client = connect(cli)?;
    let outcome = client
        .renew_outcome(&args.key, args.token, args.ttl)
        .with_context(|| format!("cannot renew {}", args.key))?;
    if cli.json {
        print_json(&renew_json(&args.key, args.token, args.ttl, outcome.renewed, outcome.holder_token));
    } else if outcome.renewed {
        println!("renewed");
    } else {
        println!("{}", not_held(outcome.holder_token));
    }
    Ok(if outcome.renewed { Exit::Done } else { Exit::NotObtained })
}

pub fn get(cli: &Cli, args: &GetArgs) -> Result<Exit> {
    let client = connect(cli)?;
    let holders =
        client.holders(&args.key, !args.stale).with_context(|| format!("cannot get {}", args.key))?;
    if cli.json {
        print_json(&get_json(&args.key, &holders));
    } else if holders.is_empty() {
        println!("free");
    } else {
        // A read-write lock or a semaphore has a line per holder.
        for info in &holders {
            println!("{}", describe(info));
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

pub fn session(cli: &Cli, command: &SessionCommand) -> Result<Exit> {
    match command {
        SessionCommand::Open(args) => session_open(cli, args),
        SessionCommand::Keepalive(args) => session_keepalive(cli, args),
        SessionCommand::Close(args) => session_close(cli, args),
    }
}

fn session_open(cli: &Cli, args: &SessionOpenArgs) -> Result<Exit> {
    let client = connect(cli)?;
    let owner = owner_of(cli, &args.owner.clone().unwrap_or_else(default_owner));
    let session = client.open_session_as(&owner, args.ttl).context("cannot open a session")?;
    if cli.json {
        print_json(&session_open_json(&session, &owner));
    } else {
        println!("{}", session.id);
    }
    Ok(Exit::Done)
}

/// The line a keep-alive or close of a session that is not open prints.
fn not_open(session: u64) -> String {
    format!("session {session} is not open (closed, or it lapsed and everything it held was freed)")
}

fn session_keepalive(cli: &Cli, args: &SessionKeepaliveArgs) -> Result<Exit> {
    let client = connect(cli)?;
    let mut warned = false;
    loop {
        let kept = client
            .keep_alive_outcome(args.id)
            .with_context(|| format!("cannot keep session {} alive", args.id))?;
        let Some(ttl) = kept else {
            if cli.json {
                print_json(&session_keepalive_json(args.id, std::time::Duration::ZERO, false));
            } else {
                println!("{}", not_open(args.id));
            }
            return Ok(Exit::NoSession);
        };
        let Some(every) = args.every else {
            if cli.json {
                print_json(&session_keepalive_json(args.id, ttl, true));
            } else {
                println!("kept alive for {}", human(ttl));
            }
            return Ok(Exit::Done);
        };
        if every >= ttl && !warned {
            warned = true;
            eprintln!(
                "fencelock: --every {} is not shorter than session {}'s TTL ({}): it will lapse between \
                 keep-alives",
                human(every),
                args.id,
                human(ttl)
            );
        }
        std::thread::sleep(every);
    }
}

fn session_close(cli: &Cli, args: &SessionIdArgs) -> Result<Exit> {
    let client = connect(cli)?;
    let closed =
        client.close_session(args.id).with_context(|| format!("cannot close session {}", args.id))?;
    if cli.json {
        print_json(&session_close_json(args.id, closed));
    } else if closed {
        println!("closed");
    } else {
        println!("{}", not_open(args.id));
    }
    Ok(if closed { Exit::Done } else { Exit::NoSession })
}

/// Asks every endpoint, not just one, so that a split view shows, and sums
/// the cluster up from the leader's answer first: if no endpoint is the
/// leader, it asks the leader the answers name. Exits 1 when no endpoint
/// answers, 2 when no leader answers or the leader has no quorum.
pub fn status(cli: &Cli) -> Result<Exit> {
    let client = connect(cli)?;
    let ask = |endpoint: &str| {
        client.status(endpoint).map_err(|error| match error {
            // One node, not the cluster, failed to answer.
            ClientError::Unavailable(reason) => reason,
            other => other.to_string(),
        })
    };
    let answers: Vec<(String, Result<NodeStatus, String>)> =
        cli.endpoints.iter().map(|endpoint| (endpoint.clone(), ask(endpoint))).collect();
    let leader = leader_answer(&cli.endpoints, &answers, ask);
    let summary = Summary::of(answers.iter().filter_map(|(_, answer)| answer.as_ref().ok()).chain(&leader));
    if cli.json {
        print_json(&status_json(&answers, &summary));
    } else {
        println!("{}", summary.line());
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
                    status_notes(node),
                ),
                Err(error) => println!("{endpoint}  error: {error}"),
            }
        }
        // The members as the leader knows them (it alone hears from all),
        // else as the first node to answer does.
        let leader_view = answers
            .iter()
            .filter_map(|(_, answer)| answer.as_ref().ok())
            .chain(&leader)
            .find(|node| summary.leader == Some(node.node_id) && node.role == "leader");
        let first = answers.iter().find_map(|(_, answer)| answer.as_ref().ok());
        if let Some(view) = leader_view.or(first) {
            if !view.cluster_id.is_empty() {
                println!("cluster: {}", view.cluster_id);
            }
            println!("members:");
            for member in &view.members {
                let client_addr = if member.client_addr.is_empty() { "?" } else { &member.client_addr };
                // Peer addresses are shown to admins only, over TLS.
                let peer_addr = if member.peer_addr.is_empty() { "(admins only)" } else { &member.peer_addr };
                let learner = if member.role == "learner" { "  learner" } else { "" };
                // A follower hears from its leader only: only the leader's
                // view says who is out of reach.
                let unreachable =
                    if leader_view.is_some() && !member.reachable { "  unreachable" } else { "" };
                println!("  {}  peer={peer_addr} client={client_addr}{learner}{unreachable}", member.id);
            }
        }
    }
    if answers.iter().all(|(_, answer)| answer.is_err()) {
        // The answers are printed already (one JSON object with --json), so
        // only a line on stderr is left to say.
        eprintln!("fencelock: no endpoint answered");
        return Ok(Exit::Failed);
    }
    if !summary.serves() {
        eprintln!(
            "fencelock: {}",
            if summary.leader.is_some() { "the leader has no quorum" } else { "no leader answered" }
        );
        return Ok(Exit::NoQuorum);
    }
    Ok(Exit::Done)
}

/// The leader's own answer when no endpoint answered as the leader of the
/// latest term the answers know, but one names that leader's address:
/// asked there.
fn leader_answer(
    endpoints: &[String],
    answers: &[(String, Result<NodeStatus, String>)],
    ask: impl Fn(&str) -> Result<NodeStatus, String>,
) -> Option<NodeStatus> {
    let answered: Vec<&NodeStatus> = answers.iter().filter_map(|(_, answer)| answer.as_ref().ok()).collect();
    let hint = answered
        .iter()
        .filter(|node| node.leader_id != 0 && !node.leader_addr.is_empty())
        .max_by_key(|node| node.term)?;
    // A leader of that term or later answered already (one of an older
    // term, cut off, has not stepped down yet: ask the newer one).
    if answered.iter().any(|node| node.role == "leader" && node.term >= hint.term) {
        return None;
    }
    if endpoints.contains(&hint.leader_addr) {
        // Asked already, and it did not answer as the leader.
        return None;
    }
    ask(&hint.leader_addr).ok().filter(|node| node.role == "leader")
}

/// A release or renewal that found the lock not held under its token:
/// `not held (held under token N)`, or `not held (free)`.
pub fn not_held(holder_token: Option<u64>) -> String {
    match holder_token {
        Some(holder) => format!("not held (held under token {holder})"),
        None => "not held (free)".to_owned(),
    }
}

/// One lock on one line: `KEY token=T owner=O lease=10s left=7s 400ms`
/// (the time left on the lease, to a tenth of a second, by the answering
/// node's clock: the leader's unless `get --stale`). A key held back by
/// lock-delay: `KEY held back by lock-delay after token=T (owner=O) expired
/// delay=30s left=12s`.
pub fn describe(info: &LockInfo) -> String {
    if info.delayed {
        return format!(
            "{} held back by lock-delay after token={} (owner={}) expired delay={} left={}",
            String::from_utf8_lossy(&info.key),
            info.token,
            String::from_utf8_lossy(&info.owner),
            human(std::time::Duration::from_millis(info.lease_ms)),
            human(std::time::Duration::from_millis(info.remaining_ms / 100 * 100))
        );
    }
    let mut line = format!(
        "{} token={} owner={} lease={} left={}",
        String::from_utf8_lossy(&info.key),
        info.token,
        String::from_utf8_lossy(&info.owner),
        human(std::time::Duration::from_millis(info.lease_ms)),
        human(std::time::Duration::from_millis(info.remaining_ms / 100 * 100))
    );
    match info.share {
        ShareKind::Exclusive => {}
        ShareKind::Read => line.push_str(" share=read"),
        ShareKind::Write => line.push_str(" share=write"),
        ShareKind::Permit => line.push_str(&format!(" share=permit/{}", info.permits)),
    }
    if let Some(session) = info.session {
        line.push_str(&format!(" session={session}"));
    }
    // The value last: it may hold spaces.
    if !info.value.is_empty() {
        line.push_str(&format!(" value={}", String::from_utf8_lossy(&info.value)));
    }
    line
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    #[test]
    fn a_lock_is_described_with_its_lease_and_the_time_left() {
        let info = LockInfo {
            key: b"jobs/a".to_vec(),
            token: 7,
            owner: b"o".to_vec(),
            lease_ms: 10_000,
            remaining_ms: 7_467,
            delayed: false,
            value: Vec::new(),
            share: fencelock_client::ShareKind::Exclusive,
            permits: 0,
            session: None,
        };
        assert_eq!(describe(&info), "jobs/a token=7 owner=o lease=10s left=7s 400ms");
        let leader = LockInfo { value: b"10.0.0.1:80".to_vec(), ..info.clone() };
        assert_eq!(describe(&leader), "jobs/a token=7 owner=o lease=10s left=7s 400ms value=10.0.0.1:80");
        let held_back = LockInfo { delayed: true, lease_ms: 30_000, remaining_ms: 12_050, ..info.clone() };
        assert_eq!(
            describe(&held_back),
            "jobs/a held back by lock-delay after token=7 (owner=o) expired delay=30s left=12s"
        );
        let in_session = LockInfo { session: Some(12), value: b"v w".to_vec(), ..info.clone() };
        assert_eq!(
            describe(&in_session),
            "jobs/a token=7 owner=o lease=10s left=7s 400ms session=12 value=v w"
        );
        let ran_out = LockInfo { remaining_ms: 0, ..info };
        assert!(describe(&ran_out).ends_with(" left=0s"), "{}", describe(&ran_out));
    }

    fn node(id: u64, role: &str, term: u64, leader_id: u64) -> NodeStatus {
        NodeStatus {
            node_id: id,
            role: role.into(),
            term,
            leader_id,
            leader_addr: if leader_id == 0 { String::new() } else { format!("h:710{leader_id}") },
            commit_index: 0,
            applied_index: 0,
            last_index: 0,
            snapshot_index: 0,
            snapshot_bytes: 0,
            locks: 0,
            last_token: 0,
            members: vec![],
            rejoining: false,
            cluster_id: String::new(),
            starting: false,
            waiting_for: vec![],
            quorum: true,
        }
    }

    /// What `leader_answer` asked, and its answer.
    fn leader_of(endpoints: &[&str], answers: Vec<Result<NodeStatus, String>>) -> (Vec<String>, Option<u64>) {
        let endpoints: Vec<String> = endpoints.iter().map(|endpoint| (*endpoint).to_owned()).collect();
        let answers: Vec<_> = endpoints.iter().cloned().zip(answers).collect();
        let asked = RefCell::new(Vec::new());
        let ask = |addr: &str| {
            asked.borrow_mut().push(addr.to_owned());
            Ok(node(addr.strip_prefix("h:710").unwrap_or("0").parse().unwrap_or(0), "leader", 5, 0))
        };
        let leader = leader_answer(&endpoints, &answers, ask).map(|leader| leader.node_id);
        (asked.into_inner(), leader)
    }

    #[test]
    fn the_leader_is_asked_at_its_hint_only_when_no_endpoint_is_it() {
        // Only followers given: their leader is asked.
        let followers = vec![Ok(node(2, "follower", 5, 1)), Err("refused".into())];
        assert_eq!(leader_of(&["h:7102", "h:7103"], followers), (vec!["h:7101".to_owned()], Some(1)));
        // The leader is among the answers: nothing more to ask.
        let with_leader = vec![Ok(node(1, "leader", 5, 1)), Ok(node(2, "follower", 5, 1))];
        assert_eq!(leader_of(&["h:7101", "h:7102"], with_leader), (vec![], None));
        // A leader of an older term, cut off: the newer one is asked.
        let stale = vec![Ok(node(3, "leader", 4, 3)), Ok(node(2, "follower", 5, 1))];
        assert_eq!(leader_of(&["h:7103", "h:7102"], stale), (vec!["h:7101".to_owned()], Some(1)));
        // The hint is an endpoint that did not answer as leader, or no hint.
        let down = vec![Err("refused".into()), Ok(node(2, "follower", 5, 1))];
        assert_eq!(leader_of(&["h:7101", "h:7102"], down), (vec![], None));
        assert_eq!(leader_of(&["h:7102"], vec![Ok(node(2, "candidate", 6, 0))]), (vec![], None));
    }
}
