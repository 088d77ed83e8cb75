//! The job of `fencelock lock` as a process group, and its watchdog.
//!
//! The job (CMD and everything it starts: a `sh -c` and its children) runs
//! in a process group of its own, so that stopping it reaches all of it,
//! not only its first process. [`stop_group`] sends the group SIGTERM, waits
//! up to the grace for it to empty, then sends SIGKILL.
//!
//! If `fencelock lock` itself dies (kill -9, the OOM killer), the job must
//! not run on without the lock. A watchdog does that: a second `fencelock`
//! process (`fencelock __watchdog GROUP GRACE_MS`, a hidden subcommand), in
//! a process group of its own so that signals to `fencelock`'s group do not
//! reach it, reading its stdin, a pipe whose only writer is `fencelock
//! lock`. `fencelock lock` writes `done` when it is finished with the job;
//! the end of the pipe without `done` means it died, and the watchdog stops
//! the group. No `unsafe` is needed (a parent-death signal would be, and
//! would reach only the first process of the job).
//!
//! One window is left: if `fencelock lock` is killed between starting the
//! job and starting the watchdog (a few milliseconds), nobody stops the job.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;

/// The hidden subcommand that runs the watchdog.
pub const WATCHDOG_COMMAND: &str = "__watchdog";

/// What `fencelock lock` writes to its watchdog once the job is over.
const DONE: &[u8] = b"done\n";

/// How often a group is looked at while it stops.
const POLL: Duration = Duration::from_millis(20);

/// Whether any process is left in `group`.
pub fn group_alive(group: Pid) -> bool {
    // EPERM: a member exists, even if it is no longer ours to signal.
    !matches!(killpg(group, None), Err(Errno::ESRCH))
}

/// Stops every process of `group`: SIGTERM, then SIGKILL once `grace` has
/// passed with any left. `leader` (the group's first process, when it is
/// our child) is reaped as it exits, so that its zombie does not count as
/// left. Returns whether SIGKILL was needed.
pub fn stop_group(group: Pid, grace: Duration, mut leader: Option<&mut Child>) -> bool {
    let reap = |leader: &mut Option<&mut Child>| {
        if let Some(child) = leader.as_deref_mut() {
            if matches!(child.try_wait(), Ok(Some(_)) | Err(_)) {
                *leader = None;
            }
        }
    };
    let _ = killpg(group, Signal::SIGTERM);
    // A stopped job (Ctrl-Z, `fencelock lock` stopped with it) acts on
    // the SIGTERM only once continued.
    let _ = killpg(group, Signal::SIGCONT);
    let deadline = Instant::now() + grace;
    loop {
        reap(&mut leader);
        if leader.is_none() && !group_alive(group) {
            return false;
        }
        if Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(POLL.min(deadline.saturating_duration_since(Instant::now())));
    }
    let _ = killpg(group, Signal::SIGKILL);
    if let Some(child) = leader {
        let _ = child.wait();
    }
    true
}

/// `fencelock lock`'s end of the watchdog.
#[derive(Debug)]
pub struct Watchdog {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Watchdog {
    /// Starts the watchdog of `group`, which gets `grace` to stop.
    pub fn start(group: Pid, grace: Duration) -> Result<Watchdog> {
        let exe =
            std::env::current_exe().context("cannot find the fencelock binary to start its watchdog")?;
        let mut child = Command::new(&exe)
            .arg(WATCHDOG_COMMAND)
            .arg(group.as_raw().to_string())
            .arg(grace.as_millis().to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start the watchdog ({})", exe.display()))?;
        let stdin = child.stdin.take();
        Ok(Watchdog { child, stdin })
    }

    /// The job is over (or stopped): the watchdog exits, signalling nothing.
    pub fn dismiss(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        if let Some(mut stdin) = self.stdin.take() {
            let _ = stdin.write_all(DONE);
        }
        let _ = self.child.wait();
    }
}

impl Drop for Watchdog {
    /// `fencelock lock` returning, on any path, is alive to see to its job
    /// itself.
    fn drop(&mut self) {
        self.finish();
    }
}

/// The watchdog process: waits for the end of its stdin and, unless
/// `fencelock lock` said `done` first, stops `group`.
pub fn run(args: &[String]) -> ExitCode {
    let parsed = match args {
        [group, grace_ms] => group.parse::<i32>().ok().zip(grace_ms.parse::<u64>().ok()),
        _ => None,
    };
    let Some((group, grace_ms)) = parsed.filter(|(group, _)| *group > 1) else {
        eprintln!(
            "fencelock: {WATCHDOG_COMMAND} takes a process group and a grace in ms (it is fencelock lock's)"
        );
        return ExitCode::from(crate::output::EXIT_ERROR);
    };
    let mut said = Vec::new();
    // Any read error is taken as the end: the writer is gone either way.
    let _ = std::io::stdin().take(64).read_to_end(&mut said);
    if said == DONE {
        return ExitCode::SUCCESS;
    }
    let group = Pid::from_raw(group);
    if group_alive(group) {
        eprintln!("fencelock: `fencelock lock` is gone; stopping its command (process group {group})");
        stop_group(group, Duration::from_millis(grace_ms), None);
    }
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spawn_group(script: &str) -> Child {
        Command::new("sh").args(["-c", script]).process_group(0).spawn().unwrap()
    }

    fn pid_of(child: &Child) -> Pid {
        Pid::from_raw(i32::try_from(child.id()).unwrap())
    }

    #[test]
    fn a_group_is_stopped_with_its_grandchildren_and_sigkill_only_if_needed() {
        // A shell whose child sleeps: SIGTERM ends both.
        let mut leader = spawn_group("sleep 30 & wait");
        let group = pid_of(&leader);
        assert!(group_alive(group));
        assert!(!stop_group(group, Duration::from_secs(10), Some(&mut leader)));
        assert!(!group_alive(group));

        // A group that ignores SIGTERM gets SIGKILL after the grace. The
        // shell says when its trap is set: a SIGTERM before would end it,
        // and the test would prove nothing.
        let dir = tempfile::tempdir().unwrap();
        let ready = dir.path().join("trapped");
        let mut stubborn = spawn_group(&format!("trap '' TERM; : > {}; sleep 30 & wait", ready.display()));
        let group = pid_of(&stubborn);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ready.exists() {
            assert!(Instant::now() < deadline, "the shell never set its trap");
            std::thread::sleep(POLL);
        }
        assert!(stop_group(group, Duration::from_millis(300), Some(&mut stubborn)));
        let deadline = Instant::now() + Duration::from_secs(10);
        while group_alive(group) {
            assert!(Instant::now() < deadline, "the group outlived SIGKILL");
            std::thread::sleep(POLL);
        }
    }

    #[test]
    fn bad_watchdog_arguments_are_an_error() {
        for args in [&[][..], &["1".to_owned(), "10".to_owned()], &["x".to_owned(), "10".to_owned()]] {
            assert_eq!(run(args), ExitCode::from(crate::output::EXIT_ERROR), "{args:?}");
        }
    }
}
