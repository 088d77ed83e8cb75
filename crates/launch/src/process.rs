//! One running `fencelockd`: kill -9, SIGSTOP and SIGCONT, and a graceful
//! stop (SIGTERM, then SIGKILL at a deadline). A process that is not
//! detached is killed when its handle is dropped.

use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use crate::LaunchError;

/// How often a stop looks whether the process has exited.
const EXIT_POLL: Duration = Duration::from_millis(20);

/// A `fencelockd` this process started.
#[derive(Debug)]
pub struct Process {
    node: u64,
    child: Child,
    paused: bool,
    /// Outlives its handle (and the launcher), in a process group of its
    /// own.
    detached: bool,
}

/// How a graceful stop ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// The process exited by itself, after SIGTERM or before.
    Exited(ExitStatus),
    /// It was still up at the deadline and got SIGKILL.
    Killed,
}

impl Process {
    pub(crate) fn new(node: u64, child: Child, detached: bool) -> Process {
        Process { node, child, paused: false, detached }
    }

    /// The node id it was started as.
    pub fn node(&self) -> u64 {
        self.node
    }

    /// The operating system's process id, as [`std::process::Child::id`].
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Whether it is stopped by SIGSTOP.
    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// The exit status if it has exited, without waiting; as
    /// [`std::process::Child::try_wait`].
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }

    /// kill -9, and reaps it.
    pub fn kill9(mut self) -> Result<ExitStatus, LaunchError> {
        self.kill_and_reap()
    }

    /// SIGSTOP: the process freezes, its sockets stay open.
    pub fn pause(&mut self) -> Result<(), LaunchError> {
        self.signal(Signal::SIGSTOP)?;
        self.paused = true;
        Ok(())
    }

    /// SIGCONT, if it is paused.
    pub fn resume(&mut self) -> Result<(), LaunchError> {
        if self.paused {
            self.signal(Signal::SIGCONT)?;
            self.paused = false;
        }
        Ok(())
    }

    /// Asks it to stop: SIGCONT if paused (a stopped process cannot act on
    /// SIGTERM), then SIGTERM. [`Process::wait_until`] waits for the exit;
    /// [`Process::stop`] does both.
    pub fn terminate(&mut self) -> Result<(), LaunchError> {
        self.resume()?;
        self.signal(Signal::SIGTERM)
    }

    /// Waits for it to exit until `deadline`, then kills it.
    pub fn wait_until(mut self, deadline: Instant) -> Result<Stopped, LaunchError> {
        loop {
            if let Some(status) = self.try_wait().map_err(|source| self.wait_error(source))? {
                return Ok(Stopped::Exited(status));
            }
            if Instant::now() >= deadline {
                self.kill_and_reap()?;
                return Ok(Stopped::Killed);
            }
            std::thread::sleep(EXIT_POLL);
        }
    }

    /// A graceful stop: SIGTERM, and SIGKILL if it is still up after
    /// `within`.
    pub fn stop(mut self, within: Duration) -> Result<Stopped, LaunchError> {
        self.terminate()?;
        self.wait_until(Instant::now() + within)
    }

    fn kill_and_reap(&mut self) -> Result<ExitStatus, LaunchError> {
        // SIGKILL works on a stopped process too.
        self.child.kill().map_err(|source| LaunchError::Kill { node: self.node, source })?;
        self.child.wait().map_err(|source| self.wait_error(source))
    }

    fn wait_error(&self, source: std::io::Error) -> LaunchError {
        LaunchError::Wait { node: self.node, source }
    }

    fn signal(&self, signal: Signal) -> Result<(), LaunchError> {
        signal_pid(self.node, self.child.id(), signal)
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if !self.detached {
            // Best effort: this is the last chance not to leave it behind.
            let _ = self.kill_and_reap();
        }
    }
}

/// Sends `signal` to process `pid`, which runs node `node`.
pub(crate) fn signal_pid(node: u64, pid: u32, signal: Signal) -> Result<(), LaunchError> {
    let pid = i32::try_from(pid).map_err(|_| LaunchError::Pid { node, pid })?;
    kill(Pid::from_raw(pid), signal).map_err(|source| LaunchError::Signal { node, signal, source })
}
