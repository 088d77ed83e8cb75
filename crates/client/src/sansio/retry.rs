//! [`RetryLoop`]: one call's way through the cluster, as a state machine.
//!
//! A call starts at the node that last answered (or the first endpoint),
//! follows `NOT_LEADER` to the leader's address (the first redirect at
//! once, a chain of them with backoff: stale views during an election),
//! moves on to the next endpoint with backoff when a node is unavailable,
//! times out or cannot be reached, and gives up with
//! [`ClientError::Unavailable`] once its budget is spent. The backoff starts
//! at [`BACKOFF_MIN`], doubles up to [`BACKOFF_MAX`], and each pause is
//! drawn between half of it and all of it, so that clients that failed
//! together do not come back together. A call whose every endpoint refused
//! this client's connection (TLS either side) fails at once: waiting will
//! not help.
//!
//! The shell asks [`RetryLoop::next_try`] where to send, sends, and hands
//! the result to [`RetryLoop::finish`], which says whether the call is done,
//! failed, or should pause and go on.

use std::time::{Duration, Instant};

use fencelock_types::client_pb::{ErrorCode, Response, Response_oneof_kind};

use crate::ClientError;

/// The first pause after a failed attempt; it doubles up to [`BACKOFF_MAX`].
pub const BACKOFF_MIN: Duration = Duration::from_millis(20);
pub const BACKOFF_MAX: Duration = Duration::from_millis(500);

/// The least time an attempt gets, even at the end of its call's budget.
pub const ATTEMPT_MIN: Duration = Duration::from_millis(100);

/// A call that still retries after this long tells the caller
/// ([`RetryLoop::notice`]), and then again every [`RETRY_NOTICE_EVERY`].
pub const RETRY_NOTICE_AFTER: Duration = Duration::from_secs(1);
pub const RETRY_NOTICE_EVERY: Duration = Duration::from_secs(5);

/// What a caller is told while its call keeps retrying.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Retrying {
    /// How long the call has been trying.
    pub elapsed: Duration,
    /// How long it goes on before giving up (`retry_for`).
    pub left: Duration,
    /// Why the last attempt failed.
    pub last_error: String,
}

/// How one attempt (one request to one node) ended, as the shell saw it.
#[derive(Debug)]
pub enum Outcome {
    /// The node answered with a result.
    Done(Response_oneof_kind),
    /// `NOT_LEADER` naming the leader's client address, and its id (0 when
    /// the node did not say).
    Redirect { leader: String, leader_id: u64, reason: String },
    /// Worth trying again elsewhere (a connection failed, no answer in
    /// time, `UNAVAILABLE`, `TIMEOUT`): the reason is kept for the final
    /// error.
    Retry(String),
    /// Final: retrying will not help.
    Fail(ClientError),
}

impl Outcome {
    /// Reads a node's response: its result, a redirect, a reason to retry,
    /// or a final error.
    pub fn of_response(addr: &str, response: Response) -> Outcome {
        if let Some(error) = response.error.into_option() {
            let reason = format!("{addr}: {}", error.message);
            match error.code {
                ErrorCode::OK => {}
                ErrorCode::NOT_LEADER if !error.leader_addr.is_empty() => {
                    return Outcome::Redirect {
                        leader: error.leader_addr,
                        leader_id: error.leader_id,
                        reason,
                    };
                }
                ErrorCode::NOT_LEADER | ErrorCode::TIMEOUT | ErrorCode::UNAVAILABLE => {
                    return Outcome::Retry(reason)
                }
                ErrorCode::INVALID_ARGUMENT => {
                    return Outcome::Fail(ClientError::InvalidArgument(error.message))
                }
                ErrorCode::INTERNAL => return Outcome::Fail(ClientError::Internal(error.message)),
                ErrorCode::PERMISSION_DENIED => {
                    return Outcome::Fail(ClientError::PermissionDenied(error.message))
                }
                ErrorCode::RESOURCE_EXHAUSTED => {
                    return Outcome::Fail(ClientError::ResourceExhausted(error.message))
                }
                ErrorCode::NO_SESSION => return Outcome::Fail(ClientError::NoSession(error.message)),
            }
        }
        match response.kind {
            Some(kind) => Outcome::Done(kind),
            None => Outcome::Fail(ClientError::Internal(format!("{addr}: answered without a result"))),
        }
    }
}

/// Where to send the next attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Try {
    pub endpoint: String,
    /// The most this attempt may take: what is left of the call's budget,
    /// but never under [`ATTEMPT_MIN`]. The shell takes the smaller of this
    /// and the request's own timeout.
    pub timeout: Duration,
    /// The node a redirect said is there: under TLS the shell sends only
    /// if the node's certificate names it (see [`check_node`]).
    pub node: Option<u64>,
}

/// Checks, before a request goes, that the node at `endpoint` is the one
/// a redirect named: its certificate (TLS) names node `presented`. A
/// follower's hint is only as good as what its peers said; a certificate
/// is the cluster CA's word. `None`: send; `Some`, the attempt's outcome.
/// Plain connections present nothing and are not checked.
pub fn check_node(
    endpoint: &str,
    expected: Option<u64>,
    presented: Option<u64>,
    tls: bool,
) -> Option<Outcome> {
    let expected = expected?;
    if !tls || presented == Some(expected) {
        return None;
    }
    let named = presented.map_or_else(|| "no node".to_owned(), |id| format!("node {id}"));
    Some(Outcome::Retry(format!(
        "{endpoint}: its certificate names {named}, not node {expected}, whom the redirect named: not followed"
    )))
}

/// The node id a node's certificate names, from the DER of the first
/// certificate a TLS server presented.
pub fn node_named(der: &[u8]) -> Option<u64> {
    match fencelock_tls::identity_of(der) {
        Ok(fencelock_tls::Identity::Node(id)) => Some(id),
        _ => None,
    }
}

/// What the call does after an attempt.
#[derive(Debug)]
pub enum Verdict {
    /// Answered: the result, from `endpoint` (where the next call should
    /// start).
    Done { kind: Box<Response_oneof_kind>, endpoint: String },
    /// Failed for good.
    Fail(ClientError),
    /// Pause this long (maybe zero), then ask [`RetryLoop::next_try`] again.
    Pause(Duration),
}

/// One call's retry loop. See the module doc.
#[derive(Debug)]
pub struct RetryLoop {
    endpoints: Vec<String>,
    started: Instant,
    deadline: Instant,
    next_notice: Instant,
    target: String,
    /// Where "the next endpoint" continues from; a leader address outside
    /// the list continues from the top.
    index: usize,
    backoff: Duration,
    redirected: bool,
    /// The node the current target should be (a redirect named it).
    expect: Option<u64>,
    last_reason: String,
    attempted: bool,
    /// Endpoints that refused this client's connection in this call.
    refused: Vec<String>,
    /// The jitter's random state (splitmix64), seeded by the shell.
    random: u64,
}

impl RetryLoop {
    /// A call started at `now` with `budget` to spend, over `endpoints`
    /// (not empty: [`crate::Client::connect`] checks), starting at
    /// `preferred` if given. `seed` drives the jitter: the same seed, times
    /// and outcomes give the same pauses.
    pub fn new(
        endpoints: &[String],
        preferred: Option<&str>,
        now: Instant,
        budget: Duration,
        seed: u64,
    ) -> RetryLoop {
        let target = preferred.map(str::to_owned).or_else(|| endpoints.first().cloned()).unwrap_or_default();
        let index = endpoints.iter().position(|e| *e == target).unwrap_or(endpoints.len().saturating_sub(1));
        RetryLoop {
            endpoints: endpoints.to_vec(),
            started: now,
            deadline: now + budget,
            next_notice: now + RETRY_NOTICE_AFTER,
            target,
            index,
            backoff: BACKOFF_MIN,
            redirected: false,
            expect: None,
            last_reason: "no node answered in time".to_owned(),
            attempted: false,
            refused: Vec::new(),
            random: seed,
        }
    }

    /// The next attempt at `now`, or the final error once the budget is
    /// spent. Every call makes at least one attempt, even when a busy
    /// machine ate its budget before it started.
    pub fn next_try(&mut self, now: Instant) -> Result<Try, ClientError> {
        let left = self.deadline.saturating_duration_since(now);
        if left.is_zero() && self.attempted {
            return Err(ClientError::Unavailable(self.last_reason.clone()));
        }
        if self.endpoints.is_empty() {
            return Err(ClientError::InvalidArgument("no endpoints given".to_owned()));
        }
        self.attempted = true;
        Ok(Try { endpoint: self.target.clone(), timeout: left.max(ATTEMPT_MIN), node: self.expect })
    }

    /// The attempt at [`RetryLoop::next_try`]'s endpoint ended with
    /// `outcome`, at `now`.
    pub fn finish(&mut self, now: Instant, outcome: Outcome) -> Verdict {
        let pause = match outcome {
            Outcome::Done(kind) => {
                return Verdict::Done { kind: Box::new(kind), endpoint: self.target.clone() }
            }
            Outcome::Fail(error) => return Verdict::Fail(error),
            Outcome::Redirect { leader, leader_id, reason } if leader != self.target => {
                self.last_reason = reason;
                self.target = leader;
                self.expect = (leader_id != 0).then_some(leader_id);
                // The first redirect is followed at once; a chain of them
                // backs off.
                std::mem::replace(&mut self.redirected, true)
            }
            Outcome::Redirect { reason, .. } | Outcome::Retry(reason) => {
                if refuses_this_client(&reason) {
                    if !self.refused.contains(&self.target) {
                        self.refused.push(self.target.clone());
                    }
                    if self.endpoints.iter().all(|endpoint| self.refused.contains(endpoint)) {
                        return Verdict::Fail(ClientError::InvalidArgument(format!(
                            "every endpoint refused this client's connection; last: {reason}"
                        )));
                    }
                }
                self.last_reason = reason;
                self.index = (self.index + 1) % self.endpoints.len();
                self.target = self.endpoints[self.index].clone();
                self.expect = None;
                true
            }
        };
        if !pause {
            return Verdict::Pause(Duration::ZERO);
        }
        let pause = self.jittered(self.backoff).min(self.deadline.saturating_duration_since(now));
        self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
        Verdict::Pause(pause)
    }

    /// What to tell the caller at `now`, if the call has kept retrying long
    /// enough: after [`RETRY_NOTICE_AFTER`], then every
    /// [`RETRY_NOTICE_EVERY`].
    pub fn notice(&mut self, now: Instant) -> Option<Retrying> {
        if now < self.next_notice || now >= self.deadline {
            return None;
        }
        self.next_notice = now + RETRY_NOTICE_EVERY;
        Some(Retrying {
            elapsed: now - self.started,
            left: self.deadline - now,
            last_error: self.last_reason.clone(),
        })
    }

    /// Between half of `backoff` and all of it.
    fn jittered(&mut self, backoff: Duration) -> Duration {
        let half = backoff / 2;
        let span = u64::try_from(half.as_micros()).unwrap_or(u64::MAX).max(1);
        half + Duration::from_micros(splitmix64(&mut self.random) % (span + 1))
    }
}

/// The next number of a splitmix64 sequence: small, fast and good enough
/// for jitter (not for anything secret).
fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Whether a failed attempt means that the node will not talk to this
/// client as it is configured (a certificate either side refuses, plain TCP
/// against TLS or the other way round), rather than that it is down or
/// busy. Worded by the connections of both shells and rustls.
pub fn refuses_this_client(reason: &str) -> bool {
    ["TLS handshake failed", "the server speaks TLS", "received fatal alert", "invalid peer certificate"]
        .iter()
        .any(|sign| reason.contains(sign))
}

#[cfg(test)]
mod tests {
    use fencelock_types::client_pb::{Error, StatusResponse};

    use super::*;

    fn endpoints() -> Vec<String> {
        ["a:1", "b:2", "c:3"].map(str::to_owned).to_vec()
    }

    fn answer() -> Outcome {
        Outcome::Done(Response_oneof_kind::status(StatusResponse::default()))
    }

    fn pause_of(verdict: Verdict) -> Duration {
        match verdict {
            Verdict::Pause(pause) => pause,
            other => panic!("expected a pause, got {other:?}"),
        }
    }

    #[test]
    fn a_redirect_is_followed_at_once_and_a_chain_of_them_backs_off() {
        let now = Instant::now();
        let mut call = RetryLoop::new(&endpoints(), None, now, Duration::from_secs(30), 7);
        assert_eq!(call.next_try(now).unwrap().endpoint, "a:1");
        let redirect = |to: &str| Outcome::Redirect {
            leader: to.to_owned(),
            leader_id: 0,
            reason: "not the leader".into(),
        };
        assert_eq!(pause_of(call.finish(now, redirect("c:3"))), Duration::ZERO);
        assert_eq!(call.next_try(now).unwrap().endpoint, "c:3");
        let second = pause_of(call.finish(now, redirect("b:2")));
        assert!(second >= BACKOFF_MIN / 2 && second <= BACKOFF_MIN, "{second:?}");
        assert_eq!(call.next_try(now).unwrap().endpoint, "b:2");
        match call.finish(now, answer()) {
            Verdict::Done { endpoint, .. } => assert_eq!(endpoint, "b:2"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn failures_move_round_the_endpoints_with_growing_jittered_pauses_until_the_budget_is_spent() {
        let start = Instant::now();
        let mut call = RetryLoop::new(&endpoints(), Some("b:2"), start, Duration::from_secs(3), 11);
        let mut now = start;
        let mut seen = Vec::new();
        let mut pauses = Vec::new();
        let error = loop {
            let attempt = match call.next_try(now) {
                Ok(attempt) => attempt,
                Err(error) => break error,
            };
            assert!(attempt.timeout >= ATTEMPT_MIN);
            seen.push(attempt.endpoint);
            let pause = pause_of(call.finish(now, Outcome::Retry("refused".into())));
            pauses.push(pause);
            now += pause + Duration::from_millis(1);
        };
        assert_eq!(error, ClientError::Unavailable("refused".into()));
        assert_eq!(&seen[..4], ["b:2", "c:3", "a:1", "b:2"]);
        // Each pause lies between half its backoff and all of it; the backoff
        // doubles to its cap. Not all equal: jitter.
        let mut backoff = BACKOFF_MIN;
        for pause in &pauses[..pauses.len() - 1] {
            assert!(*pause >= backoff / 2 && *pause <= backoff, "{pause:?} against {backoff:?}");
            backoff = (backoff * 2).min(BACKOFF_MAX);
        }
        let capped: Vec<_> = pauses.iter().filter(|pause| **pause >= BACKOFF_MAX / 2).collect();
        assert!(capped.windows(2).any(|pair| pair[0] != pair[1]), "{pauses:?}");
        assert!(now - start <= Duration::from_secs(3) + Duration::from_millis(100));
    }

    #[test]
    fn the_same_seed_gives_the_same_pauses_and_another_seed_others() {
        let run = |seed| {
            let now = Instant::now();
            let mut call = RetryLoop::new(&endpoints(), None, now, Duration::from_secs(30), seed);
            (0..8)
                .map(|_| {
                    call.next_try(now).unwrap();
                    pause_of(call.finish(now, Outcome::Retry("down".into())))
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }

    #[test]
    fn a_call_makes_one_attempt_even_with_no_budget_left() {
        let now = Instant::now();
        let mut call = RetryLoop::new(&endpoints(), None, now, Duration::ZERO, 0);
        assert_eq!(call.next_try(now + Duration::from_secs(1)).unwrap().timeout, ATTEMPT_MIN);
        call.finish(now, Outcome::Retry("slow".into()));
        assert!(matches!(call.next_try(now + Duration::from_secs(1)), Err(ClientError::Unavailable(_))));
    }

    #[test]
    fn a_final_error_ends_the_call_and_refusals_by_every_endpoint_too() {
        let now = Instant::now();
        let mut call = RetryLoop::new(&endpoints(), None, now, Duration::from_secs(30), 0);
        call.next_try(now).unwrap();
        let denied = Outcome::Fail(ClientError::PermissionDenied("no".into()));
        assert!(matches!(call.finish(now, denied), Verdict::Fail(ClientError::PermissionDenied(_))));

        let mut call = RetryLoop::new(&endpoints(), None, now, Duration::from_secs(30), 0);
        let refusal = "TLS handshake failed: invalid peer certificate: UnknownIssuer";
        for round in 0..3 {
            call.next_try(now).unwrap();
            let verdict = call.finish(now, Outcome::Retry(refusal.into()));
            if round < 2 {
                pause_of(verdict);
            } else {
                assert!(matches!(verdict, Verdict::Fail(ClientError::InvalidArgument(_))), "{verdict:?}");
            }
        }
    }

    #[test]
    fn notices_come_after_a_second_then_every_five() {
        let start = Instant::now();
        let mut call = RetryLoop::new(&endpoints(), None, start, Duration::from_secs(30), 0);
        call.next_try(start).unwrap();
        call.finish(start, Outcome::Retry("a:1: cannot connect".into()));
        assert_eq!(call.notice(start + Duration::from_millis(999)), None);
        let first = call.notice(start + Duration::from_secs(1)).unwrap();
        assert_eq!(first.last_error, "a:1: cannot connect");
        assert_eq!(first.left, Duration::from_secs(29));
        assert_eq!(call.notice(start + Duration::from_secs(5)), None);
        assert!(call.notice(start + Duration::from_secs(6)).is_some());
    }

    #[test]
    fn responses_read_as_outcomes() {
        let error = |code, leader: &str| Response {
            error: Some(Error {
                code,
                message: "m".into(),
                leader_addr: leader.into(),
                ..Default::default()
            })
            .into(),
            ..Default::default()
        };
        assert!(matches!(
            Outcome::of_response("a:1", error(ErrorCode::NOT_LEADER, "b:2")),
            Outcome::Redirect { leader, .. } if leader == "b:2"
        ));
        assert!(matches!(Outcome::of_response("a:1", error(ErrorCode::NOT_LEADER, "")), Outcome::Retry(_)));
        assert!(matches!(Outcome::of_response("a:1", error(ErrorCode::UNAVAILABLE, "")), Outcome::Retry(_)));
        assert!(matches!(
            Outcome::of_response("a:1", error(ErrorCode::RESOURCE_EXHAUSTED, "")),
            Outcome::Fail(ClientError::ResourceExhausted(_))
        ));
        assert!(matches!(
            Outcome::of_response("a:1", Response::default()),
            Outcome::Fail(ClientError::Internal(_))
        ));
    }

    #[test]
    fn refusals_of_this_client_are_told_from_a_node_that_is_down_or_busy() {
        for refusal in [
            "127.0.0.1:7101: TLS handshake failed: invalid peer certificate: UnknownIssuer",
            "127.0.0.1:7101: read failed: received fatal alert: UnknownCA",
            "127.0.0.1:7101: the server speaks TLS: connect with certificates",
        ] {
            assert!(refuses_this_client(refusal), "{refusal}");
        }
        for transient in [
            "127.0.0.1:7101: cannot connect: Connection refused (os error 111)",
            "127.0.0.1:7101: no answer within 5s",
            "127.0.0.1:7101: not the leader",
        ] {
            assert!(!refuses_this_client(transient), "{transient}");
        }
    }

    #[test]
    fn a_redirect_names_the_node_to_find_there_and_only_a_certificate_of_it_passes() {
        let now = Instant::now();
        let mut call =
            RetryLoop::new(&["a:1".to_owned(), "c:3".to_owned()], None, now, Duration::from_secs(5), 7);
        assert_eq!(call.next_try(now).unwrap().node, None);
        let redirect =
            Outcome::Redirect { leader: "b:2".into(), leader_id: 2, reason: "not the leader".into() };
        call.finish(now, redirect);
        let attempt = call.next_try(now).unwrap();
        assert_eq!((attempt.endpoint.as_str(), attempt.node), ("b:2", Some(2)));
        // Under TLS, a certificate of another node (or of none) stops it.
        let refused = check_node("b:2", attempt.node, Some(3), true);
        assert!(
            matches!(&refused, Some(Outcome::Retry(reason)) if reason.contains("names node 3, not node 2")),
            "{refused:?}"
        );
        assert!(matches!(check_node("b:2", attempt.node, None, true), Some(Outcome::Retry(_))));
        assert!(check_node("b:2", attempt.node, Some(2), true).is_none());
        // Plain connections present nothing to check; a configured endpoint
        // is not held to a node.
        assert!(check_node("b:2", attempt.node, None, false).is_none());
        assert!(check_node("a:1", None, Some(9), true).is_none());
        // Moving on to the next endpoint forgets the node.
        call.finish(now, refused.unwrap());
        assert_eq!(call.next_try(now + Duration::from_secs(1)).unwrap().node, None);
    }
}
