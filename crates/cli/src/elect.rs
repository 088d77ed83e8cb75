//! Leader election and watches: `elect` (run CMD while this process leads),
//! `observe` (print each leader), `proclaim` (a leader's new value) and
//! `watch` (the changes of holders under a prefix).
//!
//! An election is a lock whose holder carries a value: `elect NAME` is
//! `lock NAME` with a campaign (waiting, FIFO, as long as it takes) and a
//! value, and the same loss handling. `observe` and `watch` run until they
//! are stopped, one line (or one JSON object) per change.

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use fencelock_client::{Client, ClientError, LeaderChange, LockGuard, WatchBatch, WatchEventKind};
use serde_json::json;

use crate::args::{Cli, ElectArgs, ObserveArgs, ProclaimArgs, WatchArgs};
use crate::commands::{connect, print_json};
use crate::output::Exit;

/// The longest wait one campaign request asks for: below every server's
/// maximum wait (5 minutes by default); a longer campaign asks again.
const CAMPAIGN_CHUNK: Duration = Duration::from_secs(30);

/// How long one watch request waits for a change.
const WATCH_WAIT: Duration = Duration::from_secs(30);

pub fn elect(cli: &Cli, args: &ElectArgs) -> Result<Exit> {
    let client = connect(cli)?;
    let lock = args.as_lock();
    crate::lock::hold(cli, &lock, || campaign(&client, args))
}

/// Campaigns until this process leads, or `--wait` runs out.
fn campaign(client: &Client, args: &ElectArgs) -> Result<LockGuard, ClientError> {
    let deadline = args.wait.map(|wait| Instant::now() + wait);
    loop {
        let left =
            deadline.map_or(CAMPAIGN_CHUNK, |deadline| deadline.saturating_duration_since(Instant::now()));
        let more_time = || deadline.is_none_or(|deadline| Instant::now() < deadline);
        match client.campaign(&args.name, &args.value, args.ttl, left.min(CAMPAIGN_CHUNK)) {
            // Still someone else's turn: ask again (the wait goes on).
            Err(ClientError::WaitTimedOut { .. }) if more_time() => {}
            // No cluster for --retry-for, or a grant lost before it could
            // be used: a candidate keeps campaigning.
            Err(ClientError::Unavailable(why)) if more_time() => {
                eprintln!("fencelock: still campaigning in {}: {why}", args.name);
                std::thread::sleep(Duration::from_secs(1));
            }
            other => return other,
        }
    }
}

pub fn observe(cli: &Cli, args: &ObserveArgs) -> Result<Exit> {
    let client = connect(cli)?;
    let mut observer = client.observe(&args.name);
    loop {
        let Some(change) =
            observer.next(WATCH_WAIT).with_context(|| format!("cannot observe {}", args.name))?
        else {
            continue;
        };
        print_change(cli, &args.name, &change);
        if args.once {
            return Ok(if change.leader.is_some() { Exit::Done } else { Exit::NotObtained });
        }
    }
}

fn print_change(cli: &Cli, name: &str, change: &LeaderChange) {
    if cli.json {
        print_json(&json!({"name": name, "leader": change.leader, "index": change.index}));
        return;
    }
    match &change.leader {
        Some(leader) => println!(
            "{name} leader token={} owner={} value={} index={}",
            leader.token,
            String::from_utf8_lossy(&leader.owner),
            String::from_utf8_lossy(&leader.value),
            change.index
        ),
        None => println!("{name} no leader index={}", change.index),
    }
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
}

pub fn proclaim(cli: &Cli, args: &ProclaimArgs) -> Result<Exit> {
    let client = connect(cli)?;
    let outcome = client
        .proclaim(&args.name, args.token, &args.value)
        .with_context(|| format!("cannot proclaim in {}", args.name))?;
    if cli.json {
        print_json(&json!({
            "name": args.name,
            "token": args.token,
            "proclaimed": outcome.released,
            "holder_token": outcome.holder_token,
        }));
    } else if outcome.released {
        println!("proclaimed");
    } else {
        println!("{}", crate::commands::not_held(outcome.holder_token));
    }
    Ok(if outcome.released { Exit::Done } else { Exit::NotObtained })
}

pub fn watch(cli: &Cli, args: &WatchArgs) -> Result<Exit> {
    let client = connect(cli)?;
    let mut watch = match args.from {
        Some(index) => client.watch_from(&args.prefix, index),
        None => client.watch(&args.prefix),
    };
    loop {
        let batch = watch.next(WATCH_WAIT).with_context(|| format!("cannot watch {:?}", args.prefix))?;
        print_batch(cli, &batch);
    }
}

fn print_batch(cli: &Cli, batch: &WatchBatch) {
    if cli.json {
        if let Some(current) = &batch.current {
            print_json(&json!({"current": current, "index": batch.index, "compacted": batch.compacted}));
        }
        for event in &batch.events {
            print_json(&serde_json::to_value(event).unwrap_or_default());
        }
    } else {
        if let Some(current) = &batch.current {
            if batch.compacted {
                println!("compacted: changes may have been missed; the holders at index {}:", batch.index);
            } else {
                println!("holders at index {}:", batch.index);
            }
            for info in current {
                println!("  {}", crate::commands::describe(info));
            }
        }
        for event in &batch.events {
            let mut line = format!(
                "{} {} {} token={} owner={}",
                event.index,
                kind_name(event.kind),
                String::from_utf8_lossy(&event.key),
                event.token,
                String::from_utf8_lossy(&event.owner)
            );
            if !event.value.is_empty() {
                line.push_str(&format!(" value={}", String::from_utf8_lossy(&event.value)));
            }
            println!("{line}");
        }
    }
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
}

/// The event kind as its JSON name (`delay_lifted`).
fn kind_name(kind: WatchEventKind) -> String {
    match serde_json::to_value(kind) {
        Ok(serde_json::Value::String(name)) => name,
        _ => format!("{kind:?}"),
    }
}
