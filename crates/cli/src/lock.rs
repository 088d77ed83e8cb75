//! `fencelock lock KEY -- CMD`: run a command while holding a lock.
//!
//! The lock is acquired first (waiting up to `--wait`), then CMD runs with
//! `FENCELOCK_KEY` and `FENCELOCK_TOKEN` set, while the client's background
//! renewer keeps the lease going. CMD runs in a process group of its own
//! (the job: CMD and whatever it starts). When CMD exits, whatever it left
//! in its group is stopped, then the lock is released and CMD's exit code
//! passed on. If the lock is lost while CMD runs, the whole group is
//! stopped (SIGTERM, then SIGKILL after `--grace`): nothing of the job may
//! go on believing it holds the lock. If `fencelock` itself dies, its
//! watchdog stops the group (`crate::watchdog`).
//!
//! SIGTERM, SIGHUP and SIGINT sent to fencelock are passed on to the group,
//! and fencelock waits for CMD before releasing. In a terminal, the job's
//! group is made the terminal's foreground group while it runs, so that CMD
//! reads the terminal and Ctrl-C reaches it directly, as it would without
//! fencelock.
//!
//! Stops follow the shell's job control. When the job stops in a terminal
//! (Ctrl-Z, or a background read), fencelock gives the terminal back and
//! stops too, so that the shell sees its job stopped; a SIGTSTP sent to
//! fencelock itself is passed on to the job, and fencelock stops once the
//! job has. A stopped fencelock renews nothing: the lock may lapse. When
//! continued (`fg`, `bg`, SIGCONT), fencelock looks at the lock before the
//! job: lost, the job is stopped for good (it never runs again without
//! the lock); held, the job is continued (and given the terminal in the
//! foreground). Outside a terminal, a job stopped by someone else (a
//! SIGSTOP to its pid) keeps its lock: fencelock goes on renewing.
//!
//! Its own outcomes have exit codes the user may choose
//! (`--conflict-exit-code`, `--lost-exit-code`) so that they are not taken
//! for CMD's, and its JSON goes to stderr or `--json-file`: stdout is CMD's.

use std::io::IsTerminal;
use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use fencelock_client::{ClientError, LockGuard};
use nix::sys::signal::{killpg, SigSet, Signal};
use nix::unistd::Pid;

use crate::args::{Cli, LockArgs};
use crate::commands::connect;
use crate::output::{child_exit_code, error_json, lock_json, Exit};
use crate::watchdog::{group_alive, stop_group, Watchdog};

/// How often the child and the lock are looked at.
const POLL: Duration = Duration::from_millis(50);

/// Signals to fencelock that are passed on to CMD, each with the flag its
/// handler raises, and the flag of SIGCONT (fencelock was continued).
struct Forwarded {
    flags: Vec<(Signal, Arc<AtomicBool>)>,
    continued: Arc<AtomicBool>,
}

impl Forwarded {
    fn install() -> Result<Forwarded> {
        let register = |signal: Signal| -> Result<Arc<AtomicBool>> {
            let flag = Arc::new(AtomicBool::new(false));
            signal_hook::flag::register(signal as i32, Arc::clone(&flag))
                .with_context(|| format!("cannot handle {signal}"))?;
            Ok(flag)
        };
        let mut flags = Vec::new();
        for signal in [Signal::SIGTERM, Signal::SIGHUP, Signal::SIGINT, Signal::SIGTSTP] {
            flags.push((signal, register(signal)?));
        }
        Ok(Forwarded { flags, continued: register(Signal::SIGCONT)? })
    }

    /// Passes the signals fencelock got on to the job's group (a Ctrl-C or
    /// Ctrl-Z in a terminal reaches the job directly, its group being the
    /// foreground one, and not fencelock). True if one was SIGTSTP: asked
    /// to stop, fencelock stops once the job has.
    fn forward(&self, group: Pid) -> bool {
        let mut stop = false;
        for (signal, flag) in &self.flags {
            if flag.swap(false, Ordering::SeqCst) {
                let _ = killpg(group, *signal);
                stop |= *signal == Signal::SIGTSTP;
            }
        }
        stop
    }

    /// Whether fencelock was continued since the last call.
    fn continued(&self) -> bool {
        self.continued.swap(false, Ordering::SeqCst)
    }
}

/// Whether `child` (the job's first process) is stopped now. The stop is
/// left to be reported again (`WNOWAIT`): this asks, it does not reap.
fn is_stopped(child: Pid) -> bool {
    use nix::sys::wait::{waitid, Id, WaitPidFlag, WaitStatus};
    let flags = WaitPidFlag::WSTOPPED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    matches!(waitid(Id::Pid(child), flags), Ok(WaitStatus::Stopped(..)))
}

/// The terminal handed to the job's group while it runs, when fencelock
/// runs in the foreground of one; given back when dropped.
struct Foreground {
    own: Option<Pid>,
}

impl Foreground {
    fn hand_to(group: Pid) -> Foreground {
        let stdin = std::io::stdin();
        if !stdin.is_terminal() || nix::unistd::tcgetpgrp(&stdin).ok() != Some(nix::unistd::getpgrp()) {
            return Foreground { own: None };
        }
        // A process that sets the foreground group while not in it gets
        // SIGTTOU unless it blocks it (as shells do): fencelock is not in
        // the job's group once it has handed the terminal over.
        let mut ttou = SigSet::empty();
        ttou.add(Signal::SIGTTOU);
        if ttou.thread_block().is_err() || nix::unistd::tcsetpgrp(&stdin, group).is_err() {
            return Foreground { own: None };
        }
        // CMD may have read the terminal before it was its own, and been
        // stopped for it (SIGTTIN).
        let _ = killpg(group, Signal::SIGCONT);
        Foreground { own: Some(nix::unistd::getpgrp()) }
    }

    /// Whether fencelock runs on a terminal of its session (in its
    /// foreground or not): under a shell's job control.
    fn job_control() -> bool {
        let stdin = std::io::stdin();
        stdin.is_terminal() && nix::unistd::tcgetpgrp(&stdin).is_ok()
    }

    /// Whether the job's group has the terminal.
    fn handed(&self) -> bool {
        self.own.is_some()
    }

    /// Gives the terminal back to fencelock's group.
    fn give_back(&mut self) {
        if let Some(own) = self.own.take() {
            let _ = nix::unistd::tcsetpgrp(std::io::stdin(), own);
        }
    }
}

impl Drop for Foreground {
    fn drop(&mut self) {
        self.give_back();
    }
}

pub fn run(cli: &Cli, args: &LockArgs) -> Result<Exit> {
    let client = connect(cli)?;
    hold(cli, args, || match args.share.share() {
        Some(share) => client.acquire_shared(&args.key, share, args.ttl, args.wait),
        None => client.acquire(&args.key, args.ttl, args.wait),
    })
}

/// Runs `args.command` while holding the lock `acquire` gets (`lock`, or
/// `elect`'s campaign), with `lock`'s loss handling, exit codes and JSON.
pub fn hold(
    cli: &Cli,
    args: &LockArgs,
    acquire: impl FnOnce() -> Result<LockGuard, ClientError>,
) -> Result<Exit> {
    let (program, program_args) = args.command.split_first().context("no command given")?;
    let guard = match acquire() {
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
    let token = guard.token();
    let reason = || guard.lost_reason().unwrap_or_else(|| "lost".to_owned());
    // The JSON of a lost lock, and the exit that says so.
    let report_lost = |reason: &str| -> Result<Exit> {
        let lost = Exit::Code(args.lost_exit_code);
        emit_json(cli, args, &lock_json(&args.key, token, guard.lease(), lost, Some(reason)))?;
        Ok(lost)
    };
    if guard.is_lost() {
        // Lost before CMD could start (fencelock stopped while it waited,
        // a lease shorter than the wait for its answer): CMD never runs.
        let reason = reason();
        eprintln!("fencelock: lost the lock on {} before the command started ({reason})", args.key);
        return report_lost(&reason);
    }
    // Installed before CMD starts, so that no signal can kill fencelock
    // while CMD runs unsupervised.
    let forwarded = Forwarded::install()?;
    let mut child = std::process::Command::new(program)
        .args(program_args)
        .env("FENCELOCK_KEY", &args.key)
        .env("FENCELOCK_TOKEN", token.to_string())
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot run {program}"))?;
    // The job's group is its first process's id.
    let group = Pid::from_raw(i32::try_from(child.id()).context("the command's pid is out of range")?);
    let watchdog = match Watchdog::start(group, args.grace()) {
        Ok(watchdog) => watchdog,
        Err(error) => {
            stop_group(group, args.grace(), Some(&mut child));
            return Err(error);
        }
    };
    let mut foreground = Foreground::hand_to(group);
    // Under a shell's job control (started in the foreground or not): the
    // job's stops are fencelock's.
    let interactive = Foreground::job_control();
    // A SIGTSTP came: fencelock stops once the job has.
    let mut stop_asked = false;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(error) => {
                stop_group(group, args.grace(), Some(&mut child));
                return Err(error).context("cannot wait for the command");
            }
        }
        stop_asked |= forwarded.forward(group);
        let mut resumed = forwarded.continued();
        if (interactive || stop_asked) && is_stopped(group) {
            foreground.give_back();
            eprintln!(
                "fencelock: the command is stopped, and fencelock with it: the lock on {} is not renewed \
                 and lapses within {} unless resumed",
                args.key,
                humantime::format_duration(guard.lease())
            );
            stop_asked = false;
            // Fencelock's whole process, renewer included, until a SIGCONT.
            let _ = nix::sys::signal::raise(Signal::SIGSTOP);
            resumed = true;
        }
        // Continued: the lock is looked at before the job is.
        if guard.is_lost() {
            drop(foreground);
            let reason = reason();
            eprintln!("fencelock: lost the lock on {} ({reason}); stopping the command", args.key);
            if stop_group(group, args.grace(), Some(&mut child)) {
                eprintln!(
                    "fencelock: the command did not stop within {}; killed it",
                    humantime::format_duration(args.grace())
                );
            }
            watchdog.dismiss();
            return report_lost(&reason);
        }
        if resumed {
            if interactive && !foreground.handed() {
                // `fg`: the terminal is fencelock's again, and goes on to
                // the job (`bg`: it stays the shell's).
                foreground = Foreground::hand_to(group);
            }
            let _ = killpg(group, Signal::SIGCONT);
        }
        std::thread::sleep(POLL);
    };
    drop(foreground);
    // What CMD left running in its group does not outlive the lock.
    if group_alive(group) {
        eprintln!("fencelock: the command left processes in its group; stopping them before the release");
        stop_group(group, args.grace(), None);
    }
    watchdog.dismiss();
    // A loss noticed only now still happened while CMD ran.
    if guard.is_lost() {
        let reason = reason();
        eprintln!("fencelock: lost the lock on {} before the command finished ({reason})", args.key);
        return report_lost(&reason);
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
