//! What other threads share with a running loop: [`LoopShared`], the
//! outbox of responses, the wake-up (one per burst) and the stop flag; and
//! [`LoopWaker`], the handle that wakes a node loop's core.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::ThreadId;

use crossbeam_channel::Sender;
use fencelock_types::client_pb::Response;
use mio::{Token, Waker};

/// Wakes a node loop from another thread, so that its core runs a turn:
/// after sending it something through a channel, say. Cheap to clone; one
/// wake-up per burst.
#[derive(Clone, Debug)]
pub struct LoopWaker(pub(crate) Arc<LoopShared>);

impl LoopWaker {
    pub fn wake(&self) {
        self.0.wake();
    }
}

/// The state the event loop shares with the threads that answer requests.
#[derive(Debug)]
pub(crate) struct LoopShared {
    /// Responses for connections, each counted in its `in_flight`, and
    /// whether it answers a `list`.
    pub(crate) outbox: Sender<(Token, Response, bool)>,
    /// The same, for responses posted on the loop's own thread (by the
    /// core it runs): in order, without a channel's cost per message. The
    /// loop drains it before the channel, after every event.
    pub(crate) local: Mutex<Vec<(Token, Response, bool)>>,
    pub(crate) waker: Waker,
    /// Set when the loop was woken and has not yet looked at the outbox:
    /// a burst of responses costs one wake-up.
    pub(crate) wake_pending: AtomicBool,
    pub(crate) stopping: AtomicBool,
    /// The loop's own thread, which drains the outbox after every event
    /// and so never needs waking.
    pub(crate) loop_thread: std::sync::OnceLock<ThreadId>,
}

impl LoopShared {
    pub(crate) fn post(&self, token: Token, response: Response, list: bool) -> bool {
        if self.on_loop_thread() {
            // Only the loop thread takes this lock: it is never contended,
            // and a poisoned one (a panic between push and drain) still
            // holds whole entries.
            self.local.lock().unwrap_or_else(PoisonError::into_inner).push((token, response, list));
            return true;
        }
        if self.outbox.send((token, response, list)).is_err() {
            return false;
        }
        self.wake();
        true
    }

    /// Swaps the responses posted on the loop's thread (in the order
    /// posted) into `into`, which must be empty: its buffer is reused.
    pub(crate) fn take_local(&self, into: &mut Vec<(Token, Response, bool)>) {
        std::mem::swap(&mut *self.local.lock().unwrap_or_else(PoisonError::into_inner), into);
    }

    fn on_loop_thread(&self) -> bool {
        self.loop_thread.get() == Some(&std::thread::current().id())
    }

    pub(crate) fn wake(&self) {
        if self.on_loop_thread() {
            return;
        }
        if !self.wake_pending.swap(true, Ordering::SeqCst) {
            // Failing to write an eventfd means the process is out of
            // resources; the next event or wake-up drains the outbox anyway.
            let _ = self.waker.wake();
        }
    }
}
