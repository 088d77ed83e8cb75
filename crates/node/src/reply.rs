//! What each request is answered with, in the answer's own type.
//!
//! The node answers every request through [`Asked::answer`], which turns
//! the results its commands applied with into the operation's answer
//! ([`crate::answer`]), in this one place: a result outside the
//! operation's set (which the state machine never gives for that command,
//! short of an exhausted token counter) becomes [`RequestError::Internal`],
//! and the tests check that it never does. Askers take the answer out of a
//! [`Response`] with [`Answer::of`], so a handler matches on the outcomes
//! of its own operation only.
//!
//! It owns no state; what a command may apply with is the state machine's
//! (`fencelock-fsm`) business.

use fencelock_fsm::LockTable;
use fencelock_types::{ApplyResult, InvalidReason, Key};

use crate::answer::{Acquired, Opened, Proclaimed, Released, Renewal, SessionClosed, SessionKept};
use crate::types::{HeldLock, Member, NodeId, Reply, RequestError, Response, WatchAnswer};

/// What kind of request an answer is for: decides the answer's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Asked {
    /// Commands as given ([`crate::ClientRequest::Propose`]): the results,
    /// as the state machine gave them.
    Raw,
    /// An acquire of any kind: [`Acquired`].
    Acquire,
    /// [`Released`].
    Release,
    /// Renewals of this many locks: one [`Renewal`] each.
    Renew(usize),
    /// [`Proclaimed`].
    Proclaim,
    /// [`Opened`].
    OpenSession,
    /// [`SessionKept`].
    KeepAlive,
    /// [`SessionClosed`].
    CloseSession,
    /// A read, a watch, a membership change or a transfer: answered by the
    /// node in the answer's own type already.
    Answered,
}

/// What a holder query answers: the lock on a plain key, or the holders of
/// a read-write lock or a semaphore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holding {
    Plain(Option<HeldLock>),
    Shared(Vec<HeldLock>),
}

/// Whether the token checked holds its key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checked(pub bool);

/// The locks a list found, in key order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed(pub Vec<(Key, HeldLock)>);

/// The table, as applied up to `index`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableAt {
    pub table: Box<LockTable>,
    pub index: u64,
}

/// The members, as applied up to `index`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Membership {
    pub members: Vec<Member>,
    pub index: u64,
}

/// Leadership moved to `leader`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transferred {
    pub leader: NodeId,
}

/// An answer of one operation's type, taken out of the node's
/// [`Response`].
pub trait Answer: Sized {
    /// Takes the answer out, or gives the response back when it is of
    /// another operation (which the node never answers).
    fn take(response: Response) -> Result<Self, Response>;

    /// [`Answer::take`] of a reply: a response of another operation
    /// becomes [`RequestError::Internal`], in this one place.
    fn of(reply: Reply) -> Result<Self, RequestError> {
        Self::take(reply?).map_err(|other| {
            RequestError::Internal(format!(
                "the node answered with {other:?}, not a {}",
                std::any::type_name::<Self>().rsplit("::").next().unwrap_or("reply")
            ))
        })
    }
}

macro_rules! answers {
    ($($ty:ty => $variant:ident),* $(,)?) => {$(
        impl Answer for $ty {
            fn take(response: Response) -> Result<Self, Response> {
                match response {
                    Response::$variant(answer) => Ok(answer),
                    other => Err(other),
                }
            }
        }
    )*};
}

answers! {
    Vec<ApplyResult> => Applied,
    Acquired => Acquired,
    Released => Released,
    Vec<Renewal> => Renewed,
    Proclaimed => Proclaimed,
    Opened => Opened,
    SessionKept => SessionKept,
    SessionClosed => SessionClosed,
    WatchAnswer => Watch,
}

impl Answer for Holding {
    fn take(response: Response) -> Result<Holding, Response> {
        match response {
            Response::Holder(holder) => Ok(Holding::Plain(holder)),
            Response::Holders(holders) => Ok(Holding::Shared(holders)),
            other => Err(other),
        }
    }
}

impl Answer for Checked {
    fn take(response: Response) -> Result<Checked, Response> {
        match response {
            Response::Check(holds) => Ok(Checked(holds)),
            other => Err(other),
        }
    }
}

impl Answer for Listed {
    fn take(response: Response) -> Result<Listed, Response> {
        match response {
            Response::List(locks) => Ok(Listed(locks)),
            other => Err(other),
        }
    }
}

impl Answer for TableAt {
    fn take(response: Response) -> Result<TableAt, Response> {
        match response {
            Response::Table { table, index } => Ok(TableAt { table, index }),
            other => Err(other),
        }
    }
}

impl Answer for Membership {
    fn take(response: Response) -> Result<Membership, Response> {
        match response {
            Response::Members { members, index } => Ok(Membership { members, index }),
            other => Err(other),
        }
    }
}

impl Answer for Transferred {
    fn take(response: Response) -> Result<Transferred, Response> {
        match response {
            Response::Transferred { leader } => Ok(Transferred { leader }),
            other => Err(other),
        }
    }
}

impl Asked {
    /// The answer to a request of this kind, from the reply its commands
    /// applied with. Errors, and answers of the kinds the node builds
    /// itself, pass through.
    pub fn answer(self, reply: Reply) -> Reply {
        let results = match (self, reply) {
            (Asked::Raw | Asked::Answered, reply) => return reply,
            (_, Err(err)) => return Err(err),
            (_, Ok(Response::Applied(results))) => results,
            (asked, Ok(other)) => return Err(outside(asked, &other)),
        };
        let one = match results.as_slice() {
            [one] => Some(*one),
            _ => None,
        };
        let answer = match (self, one) {
            (Asked::Acquire, Some(result)) => acquired(result).map(Response::Acquired),
            (Asked::Release, Some(result)) => released(result).map(Response::Released),
            (Asked::Proclaim, Some(result)) => proclaimed(result).map(Response::Proclaimed),
            (Asked::OpenSession, Some(ApplyResult::Granted { token, lease_ms, existing: false })) => {
                Some(Response::Opened(Opened { session: token, ttl_ms: lease_ms }))
            }
            (Asked::KeepAlive, Some(result)) => session_kept(result).map(Response::SessionKept),
            (Asked::CloseSession, Some(result)) => session_closed(result).map(Response::SessionClosed),
            (Asked::Renew(n), _) if results.len() == n => results
                .iter()
                .map(|result| renewal(*result))
                .collect::<Option<Vec<_>>>()
                .map(Response::Renewed),
            _ => None,
        };
        answer.ok_or_else(|| outside(self, &results))
    }
}

/// The error for results outside an operation's set: a state machine that
/// refused the command as invalid (an exhausted token counter), or a bug.
fn outside(asked: Asked, results: &(impl std::fmt::Debug + ?Sized)) -> RequestError {
    RequestError::Internal(format!("a {asked:?} request applied with {results:?}"))
}

fn acquired(result: ApplyResult) -> Option<Acquired> {
    Some(match result {
        ApplyResult::Granted { token, lease_ms, existing } => Acquired::Granted { token, lease_ms, existing },
        ApplyResult::GrantRejected { holder_token } => Acquired::Held { holder_token },
        ApplyResult::Mismatch { permits } => Acquired::Mismatch { permits },
        ApplyResult::NoSession { session } => Acquired::NoSession { session },
        ApplyResult::Denied { token } => Acquired::NotSessionOwner { session: token },
        _ => return None,
    })
}

fn released(result: ApplyResult) -> Option<Released> {
    Some(match result {
        ApplyResult::Released { token } => Released::Released { token },
        ApplyResult::NotFound { holder_token } => Released::NotHeld { holder_token },
        ApplyResult::Denied { token } => Released::NotYours { token },
        _ => return None,
    })
}

fn renewal(result: ApplyResult) -> Option<Renewal> {
    Some(match result {
        ApplyResult::Renewed { token, lease_ms } => Renewal::Renewed { token, lease_ms },
        ApplyResult::NotFound { holder_token } => Renewal::NotHeld { holder_token },
        ApplyResult::Denied { token } => Renewal::NotYours { token },
        _ => return None,
    })
}

fn proclaimed(result: ApplyResult) -> Option<Proclaimed> {
    Some(match result {
        ApplyResult::Proclaimed { token } => Proclaimed::Proclaimed { token },
        ApplyResult::NotFound { holder_token } => Proclaimed::NotHeld { holder_token },
        ApplyResult::Denied { token } => Proclaimed::NotYours { token },
        ApplyResult::Invalid { reason: InvalidReason::SharedHolderHasNoValue } => Proclaimed::SharedHolder,
        _ => return None,
    })
}

fn session_kept(result: ApplyResult) -> Option<SessionKept> {
    Some(match result {
        ApplyResult::Renewed { lease_ms, .. } => SessionKept::Kept { ttl_ms: lease_ms },
        ApplyResult::NoSession { .. } => SessionKept::NotOpen,
        ApplyResult::Denied { .. } => SessionKept::NotYours,
        _ => return None,
    })
}

fn session_closed(result: ApplyResult) -> Option<SessionClosed> {
    Some(match result {
        ApplyResult::Released { .. } => SessionClosed::Closed,
        ApplyResult::NoSession { .. } => SessionClosed::NotOpen,
        ApplyResult::Denied { .. } => SessionClosed::NotYours,
        _ => return None,
    })
}

#[cfg(test)]
#[path = "reply_tests.rs"]
mod tests;
