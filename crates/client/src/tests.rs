//! Client tests against fake servers: a std `TcpListener` on 127.0.0.1 in a
//! thread, speaking the frame protocol with a scripted handler.

use std::io::{BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use fencelock_net::frame::{encode_frame, read_frame};
use fencelock_types::client_pb::{
    AcquireOutcome, AcquireResponse, CheckResponse, Error, ErrorCode, GetResponse, ReleaseResponse,
    RenewRequest, RenewResponse, RenewResult, Request, Request_oneof_kind, Response, Response_oneof_kind,
    SessionResponse, StatusResponse,
};
use protobuf::SingularPtrField;

use crate::{Client, ClientConfig, ClientError};

/// How long a test waits for something that should happen in milliseconds.
const PATIENCE: Duration = Duration::from_secs(5);

/// What a fake server does with one request: the responses to write now
/// (maybe none, maybe earlier stashed ones), or `None` to close the
/// connection.
type Script = dyn FnMut(&Request) -> Option<Vec<Response>> + Send;

struct FakeServer {
    addr: String,
    requests: Receiver<Request>,
    connections: Arc<AtomicUsize>,
}

impl FakeServer {
    fn start(script: impl FnMut(&Request) -> Option<Vec<Response>> + Send + 'static) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let script: Arc<Mutex<Box<Script>>> = Arc::new(Mutex::new(Box::new(script)));
        let (record, requests) = unbounded();
        let connections = Arc::new(AtomicUsize::new(0));
        let accepted = Arc::clone(&connections);
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                accepted.fetch_add(1, Ordering::SeqCst);
                let script = Arc::clone(&script);
                let record = record.clone();
                thread::spawn(move || serve(stream, &script, &record));
            }
        });
        FakeServer { addr, requests, connections }
    }

    /// Waits for a recorded request that `wanted` accepts, skipping others.
    fn wait_for(&self, what: &str, mut wanted: impl FnMut(&Request) -> bool) -> Request {
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self.requests.recv_deadline(deadline) {
                Ok(request) if wanted(&request) => return request,
                Ok(_) => {}
                Err(_) => panic!("the fake server saw no {what}"),
            }
        }
    }

    fn recorded(&self) -> Vec<Request> {
        self.requests.try_iter().collect()
    }
}

fn serve(stream: TcpStream, script: &Mutex<Box<Script>>, record: &Sender<Request>) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    while let Ok(request) = read_frame::<Request>(&mut reader, 1 << 20) {
        let _ = record.send(request.clone());
        let answer = (script.lock().unwrap())(&request);
        let Some(responses) = answer else { return };
        let mut buffer = Vec::new();
        for response in &responses {
            encode_frame(response, &mut buffer);
        }
        if writer.write_all(&buffer).is_err() {
            return;
        }
    }
}

fn answer(id: u64, kind: Response_oneof_kind) -> Response {
    Response { id, kind: Some(kind), ..Default::default() }
}

fn error(id: u64, code: ErrorCode, message: &str, leader_addr: &str) -> Response {
    let error = Error {
        code,
        message: message.to_owned(),
        leader_addr: leader_addr.to_owned(),
        ..Default::default()
    };
    Response { id, error: SingularPtrField::some(error), ..Default::default() }
}

fn acquire_answer(
    id: u64,
    outcome: AcquireOutcome,
    token: u64,
    lease_ms: u64,
    holder_token: u64,
) -> Response {
    let response = AcquireResponse { outcome, token, lease_ms, holder_token, ..Default::default() };
    answer(id, Response_oneof_kind::acquire(response))
}

/// The answer to `renew`: every lock in it `renewed`, or none.
fn renew_answer(id: u64, renew: &RenewRequest, renewed: bool) -> Response {
    let results: Vec<RenewResult> = renew
        .locks
        .iter()
        .map(|lock| RenewResult { key: lock.key.clone(), token: lock.token, renewed, ..Default::default() })
        .collect();
    let response = RenewResponse { results: results.into(), lease_ms: renew.lease_ms, ..Default::default() };
    answer(id, Response_oneof_kind::renew(response))
}

/// A server that grants every acquire (token 7, the lease asked for),
/// answers renewals with `renewed`, releases, and answers get and check.
fn lock_server(renewed: bool) -> FakeServer {
    FakeServer::start(move |request| {
        let id = request.id;
        let response = match &request.kind {
            Some(Request_oneof_kind::acquire(acquire)) => {
                acquire_answer(id, AcquireOutcome::GRANTED, 7, acquire.lease_ms, 0)
            }
            Some(Request_oneof_kind::renew(renew)) => renew_answer(id, renew, renewed),
            Some(Request_oneof_kind::release(release)) => {
                let response = ReleaseResponse { released: true, token: release.token, ..Default::default() };
                answer(id, Response_oneof_kind::release(response))
            }
            Some(Request_oneof_kind::check(_)) => {
                answer(id, Response_oneof_kind::check(CheckResponse { holds: true, ..Default::default() }))
            }
            Some(Request_oneof_kind::get(get)) => answer(id, get_answer(&get.key, 7)),
            Some(Request_oneof_kind::status(_)) => {
                let status =
                    StatusResponse { node_id: 1, role: "leader".into(), term: 2, ..Default::default() };
                answer(id, Response_oneof_kind::status(status))
            }
            _ => error(id, ErrorCode::INVALID_ARGUMENT, "not scripted", ""),
        };
        Some(vec![response])
    })
}

fn get_answer(key: &[u8], token: u64) -> Response_oneof_kind {
    let holder = fencelock_types::client_pb::LockInfo {
        key: key.to_vec(),
        token,
        owner: b"someone".to_vec(),
        lease_ms: 1000,
        ..Default::default()
    };
    Response_oneof_kind::get(GetResponse { holder: SingularPtrField::some(holder), ..Default::default() })
}

fn client(endpoints: &[&str]) -> Client {
    let mut config = ClientConfig::new(endpoints.iter().copied());
    config.request_timeout = Duration::from_secs(2);
    config.retry_for = Duration::from_secs(5);
    Client::connect(config).unwrap()
}

/// An address that refuses connections at once: nothing can listen on port
/// 0, whereas a port bound and let go may be taken by a parallel test.
fn closed_addr() -> String {
    "127.0.0.1:0".to_owned()
}

fn poll_until(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !condition() {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        thread::sleep(Duration::from_millis(5));
    }
}

fn is_renew(request: &Request) -> bool {
    matches!(request.kind, Some(Request_oneof_kind::renew(_)))
}

#[test]
fn an_empty_endpoint_list_is_refused() {
    let empty: [&str; 0] = [];
    assert!(matches!(Client::connect(ClientConfig::new(empty)), Err(ClientError::InvalidArgument(_))));
    assert!(matches!(Client::connect(ClientConfig::new([" "])), Err(ClientError::InvalidArgument(_))));
}

#[test]
fn pipelined_requests_answered_out_of_order_reach_their_callers() {
    let mut stashed: Option<Request> = None;
    let server = FakeServer::start(move |request| {
        let Some(Request_oneof_kind::get(get)) = &request.kind else { return Some(vec![]) };
        let token = |key: &[u8]| if key == b"a" { 1 } else { 2 };
        if get.key == b"warm-up" {
            return Some(vec![answer(request.id, get_answer(&get.key, 9))]);
        }
        // Holds the first request back and answers it after the second.
        match stashed.take() {
            None => {
                stashed = Some(request.clone());
                Some(vec![])
            }
            Some(first) => {
                let Some(Request_oneof_kind::get(first_get)) = &first.kind else { return None };
                Some(vec![
                    answer(request.id, get_answer(&get.key, token(&get.key))),
                    answer(first.id, get_answer(&first_get.key, token(&first_get.key))),
                ])
            }
        }
    });
    let client = client(&[&server.addr]);
    // One call first, so that both concurrent calls share its connection.
    assert_eq!(client.get("warm-up", true).unwrap().unwrap().token, 9);
    let callers: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|key| {
            let client = client.clone();
            thread::spawn(move || client.get(key, true))
        })
        .collect();
    let answers: Vec<_> =
        callers.into_iter().map(|caller| caller.join().unwrap().unwrap().unwrap()).collect();
    assert_eq!((answers[0].key.as_slice(), answers[0].token), (b"a".as_slice(), 1));
    assert_eq!((answers[1].key.as_slice(), answers[1].token), (b"b".as_slice(), 2));
    assert_eq!(server.connections.load(Ordering::SeqCst), 1);
    let ids: Vec<u64> = server.recorded().iter().map(|request| request.id).collect();
    assert_eq!(ids.len(), 3);
    assert!(ids.iter().all(|id| *id != 0));
    assert!(ids[0] != ids[1] && ids[1] != ids[2] && ids[0] != ids[2], "{ids:?}");
}

#[test]
fn not_leader_is_followed_to_the_leader_which_is_then_remembered() {
    let leader = lock_server(true);
    let leader_addr = leader.addr.clone();
    let follower = FakeServer::start(move |request| {
        Some(vec![error(request.id, ErrorCode::NOT_LEADER, "not leader", &leader_addr)])
    });
    let client = client(&[&follower.addr]);
    let grant = client.acquire_raw(b"me", "k", Duration::from_secs(10), Duration::ZERO).unwrap();
    assert_eq!(grant.token, 7);
    assert!(client.check("k", 7).unwrap());
    assert_eq!(follower.recorded().len(), 1, "the second call should go straight to the leader");
    let seen = leader.recorded();
    assert_eq!(seen.len(), 2);
    let Some(Request_oneof_kind::acquire(acquire)) = &seen[0].kind else { panic!("{:?}", seen[0]) };
    assert_eq!(
        (acquire.key.as_slice(), acquire.owner.as_slice(), acquire.lease_ms),
        (b"k".as_slice(), b"me".as_slice(), 10_000)
    );
}

#[test]
fn an_unreachable_endpoint_is_skipped() {
    let server = lock_server(true);
    let client = client(&[&closed_addr(), &server.addr]);
    assert!(client.check("k", 7).unwrap());
}

#[test]
fn a_connection_level_refusal_fails_over_to_the_next_endpoint() {
    let crowded =
        FakeServer::start(|_| Some(vec![error(0, ErrorCode::UNAVAILABLE, "too many connections", "")]));
    let server = lock_server(true);
    let client = client(&[&crowded.addr, &server.addr]);
    assert!(client.check("k", 7).unwrap());
    assert_eq!(crowded.recorded().len(), 1);
}

#[test]
fn a_silent_node_times_out_and_the_next_endpoint_answers() {
    let silent = FakeServer::start(|_| Some(vec![]));
    let server = lock_server(true);
    let mut config = ClientConfig::new([silent.addr.clone(), server.addr.clone()]);
    config.request_timeout = Duration::from_millis(200);
    let client = Client::connect(config).unwrap();
    assert!(client.check("k", 7).unwrap());
}

#[test]
fn a_closed_connection_fails_its_caller_instead_of_timing_out() {
    let closing = FakeServer::start(|_| None);
    let mut config = ClientConfig::new([closing.addr.clone()]);
    config.request_timeout = Duration::from_secs(60);
    let client = Client::connect(config).unwrap();
    match client.status(&closing.addr) {
        Err(ClientError::Unavailable(reason)) => assert!(reason.contains("closed"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn giving_up_reports_unavailable_with_the_last_reason() {
    let addr = closed_addr();
    let mut config = ClientConfig::new([addr.clone()]);
    config.retry_for = Duration::from_millis(200);
    let client = Client::connect(config).unwrap();
    match client.get("k", false) {
        Err(ClientError::Unavailable(reason)) => assert!(reason.contains(&addr), "{reason}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn invalid_argument_and_internal_are_not_retried() {
    let server = FakeServer::start(|request| {
        let code = if matches!(request.kind, Some(Request_oneof_kind::get(_))) {
            ErrorCode::INVALID_ARGUMENT
        } else {
            ErrorCode::INTERNAL
        };
        Some(vec![error(request.id, code, "key is empty", "")])
    });
    let client = client(&[&server.addr, &server.addr]);
    assert_eq!(client.get("", true), Err(ClientError::InvalidArgument("key is empty".into())));
    assert_eq!(client.check("k", 1), Err(ClientError::Internal("key is empty".into())));
    assert_eq!(server.recorded().len(), 2);
}

#[test]
fn held_and_wait_timed_out_map_to_their_errors() {
    let server = FakeServer::start(|request| {
        let Some(Request_oneof_kind::acquire(acquire)) = &request.kind else { return None };
        let response = match acquire.key.as_slice() {
            b"held" => acquire_answer(request.id, AcquireOutcome::HELD, 0, 0, 5),
            b"held-unknown" => acquire_answer(request.id, AcquireOutcome::HELD, 0, 0, 0),
            _ => acquire_answer(request.id, AcquireOutcome::WAIT_TIMED_OUT, 0, 0, 6),
        };
        Some(vec![response])
    });
    let client = client(&[&server.addr]);
    let lease = Duration::from_secs(1);
    assert_eq!(
        client.acquire("held", lease, Duration::ZERO).err(),
        Some(ClientError::Held { holder_token: Some(5) })
    );
    assert_eq!(
        client.acquire("held-unknown", lease, Duration::ZERO).err(),
        Some(ClientError::Held { holder_token: None })
    );
    assert_eq!(
        client.acquire("busy", lease, Duration::from_millis(100)).err(),
        Some(ClientError::WaitTimedOut { holder_token: Some(6) })
    );
    let wait_ms: Vec<u64> = server
        .recorded()
        .iter()
        .filter_map(|request| match &request.kind {
            Some(Request_oneof_kind::acquire(acquire)) => Some(acquire.wait_ms),
            _ => None,
        })
        .collect();
    assert_eq!(wait_ms.len(), 3);
    assert!(wait_ms[2] <= 100, "{wait_ms:?}");
}

#[test]
fn the_renewer_marks_a_refused_lock_lost() {
    let server = lock_server(false);
    let client = client(&[&server.addr]);
    let guard = client.acquire("k", Duration::from_millis(300), Duration::ZERO).unwrap();
    assert_eq!((guard.key(), guard.token(), guard.lease()), (b"k".as_slice(), 7, Duration::from_millis(300)));
    server.wait_for("renewal", is_renew);
    poll_until("the guard to see its loss", || guard.is_lost());
    let reason = guard.lost_reason().unwrap();
    assert!(reason.contains("no longer holds"), "{reason}");
}

#[test]
fn the_renewer_renews_all_locks_of_one_lease_in_one_request() {
    let server = lock_server(true);
    let client = client(&[&server.addr]);
    let lease = Duration::from_millis(900);
    let first = client.acquire("a", lease, Duration::ZERO).unwrap();
    let second = client.acquire("b", lease, Duration::ZERO).unwrap();
    let other_lease = client.acquire("c", Duration::from_secs(60), Duration::ZERO).unwrap();
    let renewal = server.wait_for("renewal of both locks", |request| match &request.kind {
        Some(Request_oneof_kind::renew(renew)) => renew.locks.len() == 2,
        _ => false,
    });
    let Some(Request_oneof_kind::renew(renew)) = renewal.kind else { unreachable!("matched above") };
    assert_eq!(renew.lease_ms, 900);
    let keys: Vec<&[u8]> = renew.locks.iter().map(|lock| lock.key.as_slice()).collect();
    assert_eq!(keys, vec![b"a".as_slice(), b"b".as_slice()]);
    // Renewed locks outlive their first lease.
    let later = server.wait_for("a renewal of the longer lease", |request| match &request.kind {
        Some(Request_oneof_kind::renew(renew)) => renew.lease_ms == 60_000,
        _ => false,
    });
    assert!(is_renew(&later));
    assert!(!first.is_lost() && !second.is_lost() && !other_lease.is_lost());
    assert_eq!(first.lost_reason(), None);
}

#[test]
fn dropping_a_guard_releases_it_and_release_stops_renewal() {
    let server = lock_server(true);
    let client = client(&[&server.addr]);
    let guard = client.acquire("k", Duration::from_secs(10), Duration::ZERO).unwrap();
    drop(guard);
    let release =
        server.wait_for("release", |request| matches!(request.kind, Some(Request_oneof_kind::release(_))));
    let Some(Request_oneof_kind::release(release)) = release.kind else { unreachable!("matched above") };
    assert_eq!((release.key.as_slice(), release.token, release.force), (b"k".as_slice(), 7, false));

    let guard = client.acquire("k", Duration::from_secs(10), Duration::ZERO).unwrap();
    assert_eq!(guard.release(), Ok(true));
    let releases = server
        .recorded()
        .iter()
        .filter(|request| matches!(request.kind, Some(Request_oneof_kind::release(_))))
        .count();
    assert_eq!(releases, 1, "an explicit release is not repeated on drop");
}

#[test]
fn the_renewer_thread_ends_with_the_client_and_its_guards() {
    let server = lock_server(true);
    let client = client(&[&server.addr]);
    let guard = client.acquire("k", Duration::from_millis(300), Duration::ZERO).unwrap();
    let registry = Arc::downgrade(&client.inner.renewer.registry);
    server.wait_for("renewal", is_renew);
    drop(client);
    assert!(registry.upgrade().is_some(), "the guard keeps the client alive");
    drop(guard);
    // The thread holds the registry until it returns.
    poll_until("the renewer thread to end", || registry.upgrade().is_none());
}

#[test]
fn status_asks_one_node_and_force_release_sets_force() {
    let server = lock_server(true);
    let client = client(&[&closed_addr()]);
    let status = client.status(&server.addr).unwrap();
    assert_eq!((status.node_id, status.role.as_str(), status.term), (1, "leader", 2));
    let client = self::client(&[&server.addr]);
    assert_eq!(client.force_release("k"), Ok(true));
    let request =
        server.wait_for("release", |request| matches!(request.kind, Some(Request_oneof_kind::release(_))));
    let Some(Request_oneof_kind::release(release)) = request.kind else { unreachable!("matched above") };
    assert!(release.force);
    assert!(client.renew(&[(b"k".to_vec(), 7)], Duration::from_secs(1)).unwrap()[0].2);
}

#[test]
fn a_lease_counts_from_when_the_acquire_was_sent_not_from_its_answer() {
    // The answer comes 400 ms late (under half the lease, so no fresh
    // start) and no renewal is ever answered: the guard must count its
    // 1,000 ms lease from the send, and be lost by then, not 400 ms later
    // (docs/protocol.md, retry rule 3).
    let server = FakeServer::start(|request| match &request.kind {
        Some(Request_oneof_kind::acquire(acquire)) => {
            thread::sleep(Duration::from_millis(400));
            Some(vec![acquire_answer(request.id, AcquireOutcome::GRANTED, 7, acquire.lease_ms, 0)])
        }
        Some(Request_oneof_kind::renew(_)) => {
            // Neither answered nor refused while the test looks.
            thread::sleep(Duration::from_secs(5));
            None
        }
        _ => Some(vec![error(request.id, ErrorCode::INVALID_ARGUMENT, "not scripted", "")]),
    });
    let client = client(&[&server.addr]);
    let sent = Instant::now();
    let guard = client.acquire("k", Duration::from_millis(1_000), Duration::ZERO).unwrap();
    assert!(sent.elapsed() >= Duration::from_millis(400), "the answer was not late");
    let look_at = sent + Duration::from_millis(1_150);
    thread::sleep(look_at.saturating_duration_since(Instant::now()));
    assert!(
        guard.is_lost(),
        "1,150 ms after the acquire was sent, its 1,000 ms lease still counts as held: it was counted from the answer"
    );
}

#[test]
fn a_grant_answered_after_half_its_lease_is_renewed_before_it_is_handed_over() {
    // Granted after a wait of 600 ms of a 1,000 ms lease: the guard would
    // have under 400 ms it can prove, so the client renews first. Renewed:
    // the guard holds a full lease from the renewal. Refused: no guard.
    for renewed in [true, false] {
        let server = FakeServer::start(move |request| match &request.kind {
            Some(Request_oneof_kind::acquire(acquire)) => {
                thread::sleep(Duration::from_millis(600));
                Some(vec![acquire_answer(request.id, AcquireOutcome::GRANTED, 7, acquire.lease_ms, 0)])
            }
            Some(Request_oneof_kind::renew(renew)) => Some(vec![renew_answer(request.id, renew, renewed)]),
            Some(Request_oneof_kind::release(release)) => {
                let response = ReleaseResponse { released: true, token: release.token, ..Default::default() };
                Some(vec![answer(request.id, Response_oneof_kind::release(response))])
            }
            _ => Some(vec![error(request.id, ErrorCode::INVALID_ARGUMENT, "not scripted", "")]),
        });
        let client = client(&[&server.addr]);
        let result = client.acquire("k", Duration::from_millis(1_000), Duration::ZERO);
        let renewal = server.wait_for("the renewal before the hand-over", is_renew);
        let Some(Request_oneof_kind::renew(renew)) = renewal.kind else { unreachable!("matched above") };
        assert_eq!((renew.locks.len(), renew.locks[0].token), (1, 7));
        if renewed {
            let guard = result.expect("renewed after the late grant");
            assert_eq!(guard.token(), 7);
            assert!(!guard.is_lost(), "a freshly renewed lock counts as lost");
        } else {
            match result {
                Err(ClientError::Unavailable(_)) => {}
                Err(err) => panic!("a refused renewal reported as {err:?}"),
                Ok(_) => panic!("a lock whose renewal was refused was handed over"),
            }
        }
    }
}

/// A server of sessions: opens session 40 with the TTL asked for, keeps it
/// alive for `keep_alives` keep-alives (then: not open), grants acquires
/// under it (token 41, no lease of its own), and closes it.
fn session_server(keep_alives: usize) -> FakeServer {
    let mut kept = 0;
    FakeServer::start(move |request| {
        let id = request.id;
        let session = |session, ttl_ms, found| {
            let response = SessionResponse { session, ttl_ms, found, ..Default::default() };
            answer(id, Response_oneof_kind::session(response))
        };
        let response = match &request.kind {
            Some(Request_oneof_kind::session_open(open)) => session(40, open.ttl_ms, true),
            Some(Request_oneof_kind::session_keep_alive(keep)) => {
                kept += 1;
                session(keep.session, 300, kept <= keep_alives)
            }
            Some(Request_oneof_kind::session_close(close)) => session(close.session, 0, true),
            Some(Request_oneof_kind::acquire(acquire)) if acquire.session == 40 => {
                acquire_answer(id, AcquireOutcome::GRANTED, 41, 300, 0)
            }
            Some(Request_oneof_kind::acquire(_)) => {
                error(id, ErrorCode::NO_SESSION, "session 39 is not open", "")
            }
            Some(Request_oneof_kind::release(_)) => answer(
                id,
                Response_oneof_kind::release(ReleaseResponse { released: true, ..Default::default() }),
            ),
            _ => error(id, ErrorCode::INVALID_ARGUMENT, "not scripted", ""),
        };
        Some(vec![response])
    })
}

fn is_keep_alive(request: &Request) -> bool {
    matches!(request.kind, Some(Request_oneof_kind::session_keep_alive(_)))
}

#[test]
fn a_session_guard_keeps_its_session_alive_and_its_locks_with_it() {
    let server = session_server(usize::MAX);
    let client = client(&[&server.addr]);
    let session = client.session(Duration::from_millis(300)).unwrap();
    assert_eq!((session.id(), session.ttl()), (40, Duration::from_millis(300)));
    let guard = client.acquire_in(&session, "k", Duration::ZERO).unwrap();
    let acquire =
        server.wait_for("acquire", |request| matches!(request.kind, Some(Request_oneof_kind::acquire(_))));
    let Some(Request_oneof_kind::acquire(acquire)) = acquire.kind else { unreachable!("matched above") };
    assert_eq!((acquire.session, acquire.lease_ms), (40, 0));
    assert_eq!((guard.token(), guard.lease()), (41, Duration::from_millis(300)));
    // Past two TTLs: kept alive every third of it, the lock with it, and
    // the lock itself never renewed.
    thread::sleep(Duration::from_millis(700));
    let requests = server.recorded();
    assert!(requests.iter().filter(|request| is_keep_alive(request)).count() >= 3, "{requests:?}");
    assert!(!requests.iter().any(is_renew), "{requests:?}");
    assert!(!session.is_lost() && !guard.is_lost(), "{:?}", session.lost_reason());
    assert!(guard.time_left() > Duration::ZERO);
    // Closing the session loses its locks' guards, which then release
    // nothing (the close released everything).
    assert_eq!(session.close(), Ok(true));
    server.wait_for("close", |request| matches!(request.kind, Some(Request_oneof_kind::session_close(_))));
    assert!(guard.is_lost());
    assert!(guard.lost_reason().unwrap().contains("session 40 was closed"));
    drop(guard);
    thread::sleep(Duration::from_millis(100));
    assert!(!server
        .recorded()
        .iter()
        .any(|request| matches!(request.kind, Some(Request_oneof_kind::release(_)))));
    // Under a session that is not open: NoSession.
    assert!(matches!(client.acquire_raw_in(39, b"o", "k", Duration::ZERO), Err(ClientError::NoSession(_))));
}

#[test]
fn a_session_answered_not_open_is_lost_and_a_dropped_guard_closes_its_session() {
    let server = session_server(1);
    let client = client(&[&server.addr]);
    let session = client.session(Duration::from_millis(300)).unwrap();
    let guard = client.acquire_shared_in(&session, "k", crate::Share::Read, Duration::ZERO).unwrap();
    poll_until("the session to see its loss", || session.is_lost());
    let reason = session.lost_reason().unwrap();
    assert!(reason.contains("session 40 is not open any more"), "{reason}");
    assert_eq!(guard.lost_reason(), Some(reason));
    assert_eq!(guard.time_left(), Duration::ZERO);
    assert_eq!(client.keep_alive(40), Ok(false));

    let server = session_server(usize::MAX);
    let client = self::client(&[&server.addr]);
    assert_eq!(
        client.open_session(Duration::from_secs(5)),
        Ok(crate::Session { id: 40, ttl: Duration::from_secs(5) })
    );
    assert_eq!(client.keep_alive(40), Ok(true));
    let session = client.session(Duration::from_secs(5)).unwrap();
    drop(session);
    server.wait_for("close on drop", |request| {
        matches!(request.kind, Some(Request_oneof_kind::session_close(_)))
    });
}

/// A TLS fake server with node `id`'s certificate from `layout` that
/// answers every request with `answer` and counts the requests it read.
fn tls_server(layout: &fencelock_tls::Layout, id: u64, answer: Response) -> (String, Arc<AtomicUsize>) {
    let server = fencelock_tls::node_tls(layout, id).unwrap().client_server;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let requests = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&requests);
    thread::spawn(move || {
        for socket in listener.incoming() {
            let Ok(socket) = socket else { return };
            let (server, answer, counted) = (Arc::clone(&server), answer.clone(), Arc::clone(&counted));
            thread::spawn(move || {
                let session = rustls::ServerConnection::new(server).unwrap();
                let mut stream = rustls::StreamOwned::new(session, socket);
                while let Ok(request) = read_frame::<Request>(&mut stream, 1 << 20) {
                    counted.fetch_add(1, Ordering::SeqCst);
                    let mut frame = Vec::new();
                    encode_frame(&Response { id: request.id, ..answer.clone() }, &mut frame);
                    if stream.write_all(&frame).and_then(|()| stream.flush()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, requests)
}

#[test]
fn a_redirect_is_followed_only_to_a_node_whose_certificate_names_the_leader_it_named() {
    let dir = tempfile::tempdir().unwrap();
    let layout = fencelock_tls::Layout::new(dir.path());
    fencelock_tls::create_ca(&layout, false).unwrap();
    for id in 1..=3 {
        fencelock_tls::create_node(&layout, id, &["127.0.0.1".into()], false).unwrap();
    }
    fencelock_tls::create_client(&layout, "alice", false).unwrap();
    let held =
        Response { kind: Some(Response_oneof_kind::get(GetResponse::default())), ..Default::default() };
    let not_leader = |leader_id: u64, leader_addr: &str| Response {
        error: SingularPtrField::some(Error {
            code: ErrorCode::NOT_LEADER,
            message: "not the leader".into(),
            leader_id,
            leader_addr: leader_addr.into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let client = |endpoint: &str| {
        let mut config = ClientConfig::new(vec![endpoint.to_owned()]);
        config.retry_for = Duration::from_millis(600);
        config.request_timeout = Duration::from_secs(2);
        config.tls = Some(crate::TlsConfig { certs_dir: dir.path().to_owned(), user: "alice".into() });
        Client::connect(config).unwrap()
    };

    // Node 3's certificate at the address node 1 says node 2 leads from.
    let (impostor, impostor_requests) = tls_server(&layout, 3, held.clone());
    let (follower, _) = tls_server(&layout, 1, not_leader(2, &impostor));
    let err = client(&follower).get("k", true).unwrap_err();
    assert!(matches!(err, ClientError::Unavailable(_)), "{err}");
    assert_eq!(impostor_requests.load(Ordering::SeqCst), 0, "a request went to the wrong node");

    // Node 2 there: followed.
    let (leader, leader_requests) = tls_server(&layout, 2, held);
    let (follower, _) = tls_server(&layout, 1, not_leader(2, &leader));
    assert_eq!(client(&follower).get("k", true).unwrap(), None);
    assert!(leader_requests.load(Ordering::SeqCst) >= 1);
}
