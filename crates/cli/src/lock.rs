//! `fencelock lock KEY -- CMD`: run a command while holding a lock.
//!
//! The lock is acquired first (waiting up to `--wait`), then CMD runs with
//! `FENCELOCK_KEY` and `FENCELOCK_TOKEN` set, while the client's background
//! renewer keeps the lease going. When CMD exits the lock is released and its
//! exit code passed on. If the lock is lost while CMD runs, CMD is stopped
//! (SIGTERM, then SIGKILL after `--grace`): it must not go on believing it
//! holds the lock. SIGTERM and SIGHUP sent to fencelock are passed on to CMD,
//! and fencelock waits for CMD before releasing; SIGINT from a terminal
//! already reaches CMD (same process group), so fencelock only survives it.
//!
//! Its own outcomes have exit codes the user may choose
//! (`--conflict-exit-code`, `--lost-exit-code`) so that they are not taken
//! for CMD's, and its JSON goes to stderr or `--json-file`: stdout is CMD's.

use std::process::{Child, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::args::{Cli, LockArgs};
use crate::commands::connect;
use crate::output::{child_exit_code, error_json, lock_json, Exit};

/// How often the child and the lock are looked at.
const POLL: Duration = Duration::from_millis(50);

/// Signals to fencelock that are passed on to CMD, each with the flag its
/// handler raises.
struct Forwarded {
    flags: Vec<(Signal, Arc<AtomicBool>)>,
}

impl Forwarded {
    fn install() -> Result<Forwarded> {
        let mut flags = Vec::new();
        for signal in [Signal::SIGTERM, Signal::SIGHUP, Signal::SIGINT] {
            let flag = Arc::new(AtomicBool::new(false));
            signal_hook::flag::register(signal as i32, Arc::clone(&flag))
                .with_context(|| format!("cannot handle {signal}"))?;
            flags.push((signal, flag));
        }
        Ok(Forwarded { flags })
    }

    fn forward(&self, child: &Child) {
        for (signal, flag) in &self.flags {
            // The terminal sends SIGINT to the whole foreground group, CMD
            // included; sending it again would look like a second Ctrl-C.
            if flag.swap(false, Ordering::SeqCst) && *signal != Signal::SIGINT {
                let _ = send(child, *signal);
            }
        }
    }
}

pub fn run(cli: &Cli, args: &LockArgs) -> Result<Exit> {
    let (program, program_args) = args.command.split_first().context("no command given")?;
    let client = connect(cli)?;
    let guard = match client.acquire(&args.key, args.ttl, args.wait) {
        Ok(guard) => guard,
        Err(error) if error.is_not_obtained() => {
            let error = anyhow::Error::new(error).context(format!("cannot acquire {}", args.key));
            eprintln!("fencelock: {error:#}");
            let mut json = error_json(&error);
            json["exit_code"] = args.conflict_exit_code.into();
            emit_json(cli, args, &json)?;
            return Ok(Exit::Code(args.conflict_exit_code));
        }
        Err(error) => return Err(error).with_context(|| format!("cannot acquire {}", args.key)),
    };
    let lost = Exit::Code(args.lost_exit_code);
    let token = guard.token();
    // Installed before CMD starts, so that no signal can kill fencelock
    // while CMD runs unsupervised.
    let forwarded = Forwarded::install()?;
    let mut child = std::process::Command::new(program)
        .args(program_args)
        .env("FENCELOCK_KEY", &args.key)
        .env("FENCELOCK_TOKEN", token.to_string())
        .spawn()
        .with_context(|| format!("cannot run {program}"))?;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(error) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(error).context("cannot wait for the command");
            }
        }
        forwarded.forward(&child);
        if guard.is_lost() {
            let reason = guard.lost_reason().unwrap_or_else(|| "lost".to_owned());
            eprintln!("fencelock: lost the lock on {} ({reason}); stopping the command", args.key);
            stop(&mut child, args.grace())?;
            emit_json(cli, args, &lock_json(&args.key, token, guard.lease(), lost, Some(&reason)))?;
            return Ok(lost);
        }
        std::thread::sleep(POLL);
    };
    // A loss noticed only now still happened while CMD ran.
    if guard.is_lost() {
        let reason = guard.lost_reason().unwrap_or_else(|| "lost".to_owned());
        eprintln!("fencelock: lost the lock on {} before the command finished ({reason})", args.key);
        emit_json(cli, args, &lock_json(&args.key, token, guard.lease(), lost, Some(&reason)))?;
        return Ok(lost);
    }
    let lease = guard.lease();
    if let Err(error) = guard.release() {
        eprintln!(
            "fencelock: warning: cannot release {} ({error}); it expires when its lease runs out",
            args.key
        );
    }
    let exit = Exit::Child(child_exit_code(status));
    emit_json(cli, args, &lock_json(&args.key, token, lease, exit, None))?;
    Ok(exit)
}

/// Writes `lock`'s JSON result where it goes: to `--json-file` if given,
/// else to stderr with `--json`; never to stdout, which is CMD's.
pub fn emit_json(cli: &Cli, args: &LockArgs, value: &serde_json::Value) -> Result<()> {
    match &args.json_file {
        Some(path) => std::fs::write(path, format!("{value}\n"))
            .with_context(|| format!("cannot write the JSON result to {}", path.display())),
        None => {
            if cli.json {
                eprintln!("{value}");
            }
            Ok(())
        }
    }
}

/// SIGTERM, up to `grace` to exit, then SIGKILL.
fn stop(child: &mut Child, grace: Duration) -> Result<ExitStatus> {
    if send(child, Signal::SIGTERM).is_ok() {
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Some(status) = child.try_wait().context("cannot wait for the command")? {
                return Ok(status);
            }
            std::thread::sleep(POLL.min(deadline.saturating_duration_since(Instant::now())));
        }
        eprintln!(
            "fencelock: the command did not stop within {}; killing it",
            humantime::format_duration(grace)
        );
    }
    // Std's kill is SIGKILL, and harmless if the child exited meanwhile.
    let _ = child.kill();
    child.wait().context("cannot wait for the command")
}

fn send(child: &Child, signal: Signal) -> Result<()> {
    let pid = i32::try_from(child.id()).context("child pid out of range")?;
    kill(Pid::from_raw(pid), signal).with_context(|| format!("cannot send {signal} to the command"))
}
