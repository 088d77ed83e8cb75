//! [`ClientError`]: how a client call can end other than with its answer.

/// Why a call did not return its answer. Cheap to clone, so that one
/// connection failure can be handed to every caller waiting on it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClientError {
    /// Another owner holds the lock and the acquire did not wait.
    #[error("lock is held by another owner{}", holder_suffix(.holder_token))]
    Held { holder_token: Option<u64> },
    /// The key is held back by lock-delay (`fencelockd --lock-delay`): the
    /// lock under `holder_token` expired, and no one is granted the key
    /// until the delay is over, in about `left` (by the leader's clock;
    /// zero if it did not say).
    #[error("the key is held back by lock-delay after token {} expired{}", display_token(.holder_token), left_suffix(.left))]
    Delayed { holder_token: Option<u64>, left: std::time::Duration },
    /// The acquire waited for the lock until its wait ran out.
    #[error("wait timed out, lock is still held by another owner{}", holder_suffix(.holder_token))]
    WaitTimedOut { holder_token: Option<u64> },
    /// The request was refused as malformed or out of bounds; retrying the
    /// same request will not help.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// No node answered in time; the message is the last reason seen.
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    /// A node reported a bug or failure, or answered something unexpected.
    #[error("internal error: {0}")]
    Internal(String),
    /// The user this client connects as (TLS) may not do this: it lacks the
    /// right on the key, or the lock is another user's, or the owner is not
    /// the user's. Retrying will not help.
    #[error("{0}")]
    PermissionDenied(String),
    /// A quota or bound was reached: the lock table, or the owner's
    /// identity, holds its maximum of locks, or too many acquires wait for
    /// the key. Not retried: locks must be released first.
    #[error("resource exhausted: {0}")]
    ResourceExhausted(String),
    /// The acquire named a session that is not open: it was closed, or it
    /// lapsed and everything it held is free, or it never was. Not
    /// retried: open a new session.
    #[error("no such session: {0}")]
    NoSession(String),
}

impl ClientError {
    /// A short, stable name for the kind of error, for machine-readable
    /// output: `held`, `wait_timed_out`, `invalid_argument`, `unavailable`,
    /// `internal`, `permission_denied`, `resource_exhausted` or
    /// `no_session`.
    pub fn code(&self) -> &'static str {
        match self {
            ClientError::Held { .. } => "held",
            ClientError::Delayed { .. } => "delayed",
            ClientError::WaitTimedOut { .. } => "wait_timed_out",
            ClientError::InvalidArgument(_) => "invalid_argument",
            ClientError::Unavailable(_) => "unavailable",
            ClientError::Internal(_) => "internal",
            ClientError::PermissionDenied(_) => "permission_denied",
            ClientError::ResourceExhausted(_) => "resource_exhausted",
            ClientError::NoSession(_) => "no_session",
        }
    }

    /// True when the lock was simply not obtained (held by another owner,
    /// held back by lock-delay, or the wait ran out), as opposed to the call
    /// failing.
    pub fn is_not_obtained(&self) -> bool {
        matches!(
            self,
            ClientError::Held { .. } | ClientError::Delayed { .. } | ClientError::WaitTimedOut { .. }
        )
    }

    /// The holder's token, for [`ClientError::Held`] and
    /// [`ClientError::WaitTimedOut`] when the server knew it.
    pub fn holder_token(&self) -> Option<u64> {
        match self {
            ClientError::Held { holder_token }
            | ClientError::Delayed { holder_token, .. }
            | ClientError::WaitTimedOut { holder_token } => *holder_token,
            _ => None,
        }
    }
}

fn display_token(token: &Option<u64>) -> String {
    token.map_or_else(|| "?".to_owned(), |token| token.to_string())
}

fn left_suffix(left: &std::time::Duration) -> String {
    if left.is_zero() {
        return String::new();
    }
    let rounded =
        std::time::Duration::from_millis(u64::try_from(left.as_millis()).unwrap_or(u64::MAX) / 100 * 100);
    format!("; it can be granted again in {}", humantime_like(rounded))
}

/// `1s 500ms`, `2m 5s`: whole units, largest first.
fn humantime_like(duration: std::time::Duration) -> String {
    let mut ms = u64::try_from(duration.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return "0s".to_owned();
    }
    let mut parts = Vec::new();
    for (unit, size) in [("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
        if ms >= size {
            parts.push(format!("{}{unit}", ms / size));
            ms %= size;
        }
    }
    parts.join(" ")
}

fn holder_suffix(holder_token: &Option<u64>) -> String {
    match holder_token {
        Some(token) => format!(" (holder token {token})"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_lowercase_without_a_trailing_period() {
        let errors = [
            ClientError::Held { holder_token: Some(5) },
            ClientError::Held { holder_token: None },
            ClientError::WaitTimedOut { holder_token: Some(9) },
            ClientError::InvalidArgument("key is empty".into()),
            ClientError::Unavailable("127.0.0.1:1: connection refused".into()),
            ClientError::Internal("boom".into()),
            ClientError::PermissionDenied(
                "permission denied: user alice has no `lock` right on key k".into(),
            ),
            ClientError::ResourceExhausted("the lock table is full: it holds 10 locks, its maximum".into()),
        ];
        for error in errors {
            let message = error.to_string();
            assert!(message.starts_with(|c: char| c.is_lowercase()), "{message}");
            assert!(!message.ends_with('.'), "{message}");
        }
        assert_eq!(
            ClientError::Held { holder_token: Some(5) }.to_string(),
            "lock is held by another owner (holder token 5)"
        );
        assert_eq!(ClientError::Held { holder_token: None }.to_string(), "lock is held by another owner");
        let delayed =
            ClientError::Delayed { holder_token: Some(4), left: std::time::Duration::from_millis(2_540) };
        assert_eq!(
            delayed.to_string(),
            "the key is held back by lock-delay after token 4 expired; it can be granted again in 2s 500ms"
        );
        assert!(
            delayed.is_not_obtained() && delayed.holder_token() == Some(4) && delayed.code() == "delayed"
        );
    }

    #[test]
    fn only_held_and_wait_timed_out_are_not_obtained() {
        assert!(ClientError::Held { holder_token: None }.is_not_obtained());
        assert!(ClientError::WaitTimedOut { holder_token: Some(1) }.is_not_obtained());
        assert!(!ClientError::Unavailable(String::new()).is_not_obtained());
        assert_eq!(ClientError::WaitTimedOut { holder_token: Some(1) }.holder_token(), Some(1));
        assert_eq!(ClientError::Internal(String::new()).code(), "internal");
    }
}
