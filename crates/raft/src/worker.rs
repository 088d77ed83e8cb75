//! Snapshot work off the node's loop: encoding a snapshot of the lock table
//! ([`Action::EncodeSnapshot`]) and decoding the table of a snapshot that a
//! leader sent ([`Action::DecodeSnapshot`]), on a thread of their own. A
//! table of a million locks takes about a second either way; done on the
//! loop, that second would stall every client and heartbeat of the node.
//!
//! [`Driver`](crate::shell::Driver) owns one. It hands the work over and
//! feeds the results back to the node as events; the thread wakes the
//! node's loop when a result is ready. The node asks for one encoding and
//! one decoding at a time, so the queue holds at most two jobs.
//!
//! [`Action::EncodeSnapshot`]: crate::Action::EncodeSnapshot
//! [`Action::DecodeSnapshot`]: crate::Action::DecodeSnapshot

use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

use crossbeam_channel::{unbounded, Receiver, Sender};
use fencelock_fsm::LockTable;
use raft::prelude::Message;

use fencelock_node::Event;
use fencelock_node::SnapshotJob;

/// A job for the worker.
#[derive(Debug)]
pub(crate) enum Work {
    Encode(SnapshotJob),
    Decode(Message),
}

/// A finished job, as the event that hands it to the node.
#[derive(Debug)]
pub(crate) enum Done {
    Encoded { index: u64, data: Vec<u8> },
    Decoded { message: Box<Message>, table: Result<LockTable, fencelock_fsm::SnapshotError> },
}

impl Done {
    pub(crate) fn into_event<T>(self) -> Event<T> {
        match self {
            Done::Encoded { index, data } => Event::SnapshotEncoded { index, data },
            Done::Decoded { message, table } => Event::SnapshotDecoded { message: *message, table },
        }
    }
}

/// Wakes the loop that runs the node, once set.
pub(crate) type Wake = Arc<OnceLock<Box<dyn Fn() + Send + Sync>>>;

/// The worker thread and its two channels.
pub(crate) struct SnapshotWorker {
    /// `None` once dropped: the thread then ends.
    jobs: Option<Sender<Work>>,
    done: Receiver<Done>,
    wake: Wake,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for SnapshotWorker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SnapshotWorker")
    }
}

impl SnapshotWorker {
    /// Starts the thread, named `name`.
    pub(crate) fn spawn(name: String) -> std::io::Result<SnapshotWorker> {
        let (jobs, queued) = unbounded::<Work>();
        let (report, done) = unbounded();
        let wake: Wake = Arc::new(OnceLock::new());
        let waker = Arc::clone(&wake);
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            for work in queued {
                let finished = match work {
                    Work::Encode(job) => Done::Encoded { index: job.index, data: job.encode() },
                    Work::Decode(message) => {
                        let table = LockTable::restore(message.get_snapshot().get_data());
                        Done::Decoded { message: Box::new(message), table }
                    }
                };
                if report.send(finished).is_err() {
                    return;
                }
                if let Some(wake) = waker.get() {
                    wake();
                }
            }
        })?;
        Ok(SnapshotWorker { jobs: Some(jobs), done, wake, thread: Some(thread) })
    }

    /// What wakes the node's loop when a result is ready (a loop that
    /// waits on [`SnapshotWorker::results`] needs none).
    pub(crate) fn set_wake(&self, wake: Box<dyn Fn() + Send + Sync>) {
        let _ = self.wake.set(wake);
    }

    pub(crate) fn submit(&self, work: Work) -> bool {
        self.jobs.as_ref().is_some_and(|jobs| jobs.send(work).is_ok())
    }

    pub(crate) fn results(&self) -> &Receiver<Done> {
        &self.done
    }
}

impl Drop for SnapshotWorker {
    fn drop(&mut self) {
        // Closing the queue ends the thread after the job it is on.
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
