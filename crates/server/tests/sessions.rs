//! Sessions with real processes: a 3-node cluster of `fencelockd`, and the
//! blocking client (`fencelock-client`) and the async one
//! (`fencelock-client-async`) running one scenario each, written once over
//! a small [`Face`] trait, as `tests/clients.rs` does.
//!
//! The scenario: a session holding a plain lock, a reader, a permit and an
//! election's lead stays alive past its TTL on keep-alives alone; closing
//! it frees them all at once for another owner; a session left to lapse
//! frees everything it held, and the next grants' tokens are greater than
//! every token before (fencing); an acquire under a closed or lapsed
//! session is `NoSession`, under another owner's session
//! `PermissionDenied`; a session outlives its leader (kill -9): its
//! keep-alives go on against the next leader and its locks stay held.
//!
//! And the CLI: `session open`, `acquire --session`, `get`'s `session=ID`,
//! `session keepalive`, `session close`, exit code 4 for a session that is
//! not open.

// Test code: unwrapping is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use std::future::Future;
use std::time::{Duration, Instant};

use common::{fencelock, Cluster, DEADLINE};
use fencelock_client::{
    Client, ClientConfig, ClientError, Grant, LockGuard, LockInfo, Session, SessionGuard, Share,
};
use fencelock_client_async::{AsyncClient, AsyncLockGuard, AsyncSessionGuard};

/// What the scenario needs of a client.
trait Face: Sized + Send + Sync + 'static {
    type Session: Send + Sync;
    type Guard: Send + Sync;
    fn make(config: ClientConfig) -> Self;
    fn session(&self, ttl: Duration) -> impl Future<Output = Result<Self::Session, ClientError>> + Send;
    fn session_id(session: &Self::Session) -> u64;
    fn session_lost(session: &Self::Session) -> Option<String>;
    fn close(session: Self::Session) -> impl Future<Output = Result<bool, ClientError>> + Send;
    fn acquire_in(
        &self,
        session: &Self::Session,
        key: &str,
        wait: Duration,
    ) -> impl Future<Output = Result<Self::Guard, ClientError>> + Send;
    fn acquire_shared_in(
        &self,
        session: &Self::Session,
        key: &str,
        share: Share,
        wait: Duration,
    ) -> impl Future<Output = Result<Self::Guard, ClientError>> + Send;
    fn campaign_in(
        &self,
        session: &Self::Session,
        election: &str,
        value: &str,
        wait: Duration,
    ) -> impl Future<Output = Result<Self::Guard, ClientError>> + Send;
    fn token(guard: &Self::Guard) -> u64;
    fn lost(guard: &Self::Guard) -> Option<String>;
    fn open_session(&self, ttl: Duration) -> impl Future<Output = Result<Session, ClientError>> + Send;
    fn keep_alive(&self, session: u64) -> impl Future<Output = Result<bool, ClientError>> + Send;
    fn close_session(&self, session: u64) -> impl Future<Output = Result<bool, ClientError>> + Send;
    /// A raw acquire under `session` (`Some`) or with a lease of its own.
    fn acquire_raw(
        &self,
        session: Option<u64>,
        key: &str,
        share: Option<Share>,
        lease: Duration,
    ) -> impl Future<Output = Result<Grant, ClientError>> + Send;
    fn holders(&self, key: &str) -> impl Future<Output = Result<Vec<LockInfo>, ClientError>> + Send;
}

/// The blocking client, its calls made off the runtime's async path.
struct Blocking(Client);

fn blocking<T>(call: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(call)
}

impl Face for Blocking {
    type Session = SessionGuard;
    type Guard = LockGuard;
    fn make(config: ClientConfig) -> Self {
        Blocking(Client::connect(config).unwrap())
    }
    async fn session(&self, ttl: Duration) -> Result<SessionGuard, ClientError> {
        blocking(|| self.0.session(ttl))
    }
    fn session_id(session: &SessionGuard) -> u64 {
        session.id()
    }
    fn session_lost(session: &SessionGuard) -> Option<String> {
        session.lost_reason()
    }
    async fn close(session: SessionGuard) -> Result<bool, ClientError> {
        blocking(|| session.close())
    }
    async fn acquire_in(
        &self,
        session: &SessionGuard,
        key: &str,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        blocking(|| self.0.acquire_in(session, key, wait))
    }
    async fn acquire_shared_in(
        &self,
        session: &SessionGuard,
        key: &str,
        share: Share,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        blocking(|| self.0.acquire_shared_in(session, key, share, wait))
    }
    async fn campaign_in(
        &self,
        session: &SessionGuard,
        election: &str,
        value: &str,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        blocking(|| self.0.campaign_in(session, election, value, wait))
    }
    fn token(guard: &LockGuard) -> u64 {
        guard.token()
    }
    fn lost(guard: &LockGuard) -> Option<String> {
        guard.lost_reason()
    }
    async fn open_session(&self, ttl: Duration) -> Result<Session, ClientError> {
        blocking(|| self.0.open_session(ttl))
    }
    async fn keep_alive(&self, session: u64) -> Result<bool, ClientError> {
        blocking(|| self.0.keep_alive(session))
    }
    async fn close_session(&self, session: u64) -> Result<bool, ClientError> {
        blocking(|| self.0.close_session(session))
    }
    async fn acquire_raw(
        &self,
        session: Option<u64>,
        key: &str,
        share: Option<Share>,
        lease: Duration,
    ) -> Result<Grant, ClientError> {
        let owner = self.0.owner();
        blocking(|| match (session, share) {
            (Some(session), None) => self.0.acquire_raw_in(session, owner, key, Duration::ZERO),
            (Some(session), Some(share)) => {
                self.0.acquire_shared_raw_in(session, owner, key, share, Duration::ZERO)
            }
            (None, None) => self.0.acquire_raw(owner, key, lease, Duration::ZERO),
            (None, Some(share)) => self.0.acquire_shared_raw(owner, key, share, lease, Duration::ZERO),
        })
    }
    async fn holders(&self, key: &str) -> Result<Vec<LockInfo>, ClientError> {
        blocking(|| self.0.holders(key, true))
    }
}

struct Async(AsyncClient);

impl Face for Async {
    type Session = AsyncSessionGuard;
    type Guard = AsyncLockGuard;
    fn make(config: ClientConfig) -> Self {
        Async(AsyncClient::connect(config).unwrap())
    }
    async fn session(&self, ttl: Duration) -> Result<AsyncSessionGuard, ClientError> {
        self.0.session(ttl).await
    }
    fn session_id(session: &AsyncSessionGuard) -> u64 {
        session.id()
    }
    fn session_lost(session: &AsyncSessionGuard) -> Option<String> {
        session.lost_reason()
    }
    async fn close(session: AsyncSessionGuard) -> Result<bool, ClientError> {
        session.close().await
    }
    async fn acquire_in(
        &self,
        session: &AsyncSessionGuard,
        key: &str,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        self.0.acquire_in(session, key, wait).await
    }
    async fn acquire_shared_in(
        &self,
        session: &AsyncSessionGuard,
        key: &str,
        share: Share,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        self.0.acquire_shared_in(session, key, share, wait).await
    }
    async fn campaign_in(
        &self,
        session: &AsyncSessionGuard,
        election: &str,
        value: &str,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        self.0.campaign_in(session, election, value, wait).await
    }
    fn token(guard: &AsyncLockGuard) -> u64 {
        guard.token()
    }
    fn lost(guard: &AsyncLockGuard) -> Option<String> {
        guard.lost_reason()
    }
    async fn open_session(&self, ttl: Duration) -> Result<Session, ClientError> {
        self.0.open_session(ttl).await
    }
    async fn keep_alive(&self, session: u64) -> Result<bool, ClientError> {
        self.0.keep_alive(session).await
    }
    async fn close_session(&self, session: u64) -> Result<bool, ClientError> {
        self.0.close_session(session).await
    }
    async fn acquire_raw(
        &self,
        session: Option<u64>,
        key: &str,
        share: Option<Share>,
        lease: Duration,
    ) -> Result<Grant, ClientError> {
        let owner = self.0.owner();
        match (session, share) {
            (Some(session), None) => self.0.acquire_raw_in(session, owner, key, Duration::ZERO).await,
            (Some(session), Some(share)) => {
                self.0.acquire_shared_raw_in(session, owner, key, share, Duration::ZERO).await
            }
            (None, None) => self.0.acquire_raw(owner, key, lease, Duration::ZERO).await,
            (None, Some(share)) => self.0.acquire_shared_raw(owner, key, share, lease, Duration::ZERO).await,
        }
    }
    async fn holders(&self, key: &str) -> Result<Vec<LockInfo>, ClientError> {
        self.0.holders(key, true).await
    }
}

fn config(cluster: &Cluster, owner: &str) -> ClientConfig {
    let mut config = ClientConfig::new(cluster.endpoints());
    config.owner = Some(owner.as_bytes().to_vec());
    config.request_timeout = Duration::from_secs(2);
    config.retry_for = DEADLINE;
    config
}

/// What a session of the scenario holds: a plain lock, a reader of a
/// read-write lock and one permit of a semaphore of 1.
const KINDS: [Option<Share>; 3] = [None, Some(Share::Read), Some(Share::Permit(1))];

/// The key of each kind, under `prefix`.
fn key(prefix: &str, kind: Option<Share>) -> String {
    match kind {
        None => format!("{prefix}/lock"),
        Some(Share::Read | Share::Write) => format!("{prefix}/rw"),
        Some(Share::Permit(_)) => format!("{prefix}/sem"),
    }
}

/// What another owner asks for each kind: a writer beside a reader.
fn other(kind: Option<Share>) -> Option<Share> {
    match kind {
        Some(Share::Read) => Some(Share::Write),
        kind => kind,
    }
}

/// The other owner's acquire of every key under `prefix`, at once: all
/// granted (their tokens), or the first refusal.
async fn take_all<F: Face>(client: &F, prefix: &str) -> Result<Vec<u64>, ClientError> {
    let mut tokens = Vec::new();
    for kind in KINDS {
        let grant = client.acquire_raw(None, &key(prefix, kind), other(kind), Duration::from_secs(5)).await?;
        tokens.push(grant.token);
    }
    Ok(tokens)
}

/// Polls `take_all` until every key under `prefix` is granted.
async fn take_all_soon<F: Face>(client: &F, prefix: &str, within: Duration) -> Vec<u64> {
    let deadline = Instant::now() + within;
    let mut taken = Vec::new();
    for kind in KINDS {
        let key = key(prefix, kind);
        let grant = loop {
            match client.acquire_raw(None, &key, other(kind), Duration::from_secs(5)).await {
                Ok(grant) => break grant,
                Err(ClientError::Held { .. }) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                Err(error) => panic!("{key} was not freed within {within:?}: {error}"),
            }
        };
        taken.push(grant.token);
    }
    taken
}

async fn scenario<F: Face>(cluster: &mut Cluster, name: &str) {
    let leader_probe = cluster.client();
    cluster.leader(&leader_probe);
    let a = F::make(config(cluster, &format!("{name}-a")));
    let b = F::make(config(cluster, &format!("{name}-b")));
    let ttl = Duration::from_millis(1_500);

    // A session holds a lock, a reader, a permit and an election's lead,
    // and outlives its TTL twice over on keep-alives alone.
    let session = a.session(ttl).await.unwrap();
    let id = F::session_id(&session);
    let mut guards = Vec::new();
    for kind in KINDS {
        let key = key("kept", kind);
        let guard = match kind {
            None => a.acquire_in(&session, &key, Duration::ZERO).await,
            Some(share) => a.acquire_shared_in(&session, &key, share, Duration::ZERO).await,
        };
        guards.push(guard.unwrap());
    }
    guards.push(a.campaign_in(&session, "kept/leader", "a:80", Duration::ZERO).await.unwrap());
    let held: Vec<u64> = guards.iter().map(F::token).collect();
    assert!(held.iter().all(|token| *token > id), "tokens {held:?} after session {id}");
    tokio::time::sleep(2 * ttl + Duration::from_millis(500)).await;
    assert_eq!(F::session_lost(&session), None);
    for guard in &guards {
        assert_eq!(F::lost(guard), None);
    }
    for kind in KINDS {
        let key = key("kept", kind);
        let holders = a.holders(&key).await.unwrap();
        assert_eq!(holders.len(), 1, "{key}: {holders:?}");
        assert!(held.contains(&holders[0].token), "{key}: {holders:?}");
        assert!(matches!(
            b.acquire_raw(None, &key, other(kind), ttl).await,
            Err(ClientError::Held { holder_token: Some(token) }) if held.contains(&token)
        ));
    }
    // Another owner cannot acquire under it, guarded or not.
    assert!(
        matches!(
            b.acquire_raw(Some(id), "kept/theirs", None, ttl).await,
            Err(ClientError::PermissionDenied(_))
        ),
        "an acquire under another owner's session was not refused"
    );
    assert!(matches!(
        b.acquire_in(&session, "kept/theirs", Duration::ZERO).await,
        Err(ClientError::PermissionDenied(_))
    ));
    assert!(b.holders("kept/theirs").await.unwrap().is_empty());

    // Closed: everything it held is free at once, for another owner, under
    // greater tokens; its guards are lost; an acquire under it is refused.
    let before = *held.iter().max().unwrap();
    assert_eq!(F::close(session).await, Ok(true));
    for guard in &guards {
        assert!(F::lost(guard).is_some_and(|reason| reason.contains("closed")), "{:?}", F::lost(guard));
    }
    let taken = take_all::<F>(&b, "kept").await.unwrap();
    assert!(taken.iter().all(|token| *token > before), "{taken:?} after {before}");
    assert!(matches!(a.acquire_raw(Some(id), "kept/again", None, ttl).await, Err(ClientError::NoSession(_))));
    assert_eq!(a.keep_alive(id).await, Ok(false));
    assert_eq!(a.close_session(id).await, Ok(false));
    drop(guards);

    // Lapsed: a session never kept alive frees everything it held within
    // its TTL (and the leader's expiry round), under greater tokens.
    let lapsing = a.open_session(Duration::from_secs(1)).await.unwrap();
    let mut tokens = Vec::new();
    for kind in KINDS {
        tokens.push(a.acquire_raw(Some(lapsing.id), &key("lapse", kind), kind, ttl).await.unwrap().token);
    }
    assert!(matches!(take_all::<F>(&b, "lapse").await, Err(ClientError::Held { .. })));
    let before = tokens.iter().copied().max().unwrap();
    let started = Instant::now();
    let taken = take_all_soon::<F>(&b, "lapse", Duration::from_secs(5)).await;
    assert!(started.elapsed() >= Duration::from_millis(500), "freed after {:?}", started.elapsed());
    assert!(taken.iter().all(|token| *token > before), "{taken:?} after {before}");
    assert_eq!(a.keep_alive(lapsing.id).await, Ok(false));
    assert!(matches!(
        a.acquire_raw(Some(lapsing.id), "lapse/again", None, ttl).await,
        Err(ClientError::NoSession(_))
    ));

    // A guard whose session is closed behind its back is lost at its next
    // keep-alive, and its locks' guards with it.
    let session = a.session(ttl).await.unwrap();
    let guard = a.acquire_in(&session, "behind/lock", Duration::ZERO).await.unwrap();
    assert_eq!(a.close_session(F::session_id(&session)).await, Ok(true));
    let deadline = Instant::now() + 2 * ttl;
    while F::lost(&guard).is_none() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let reason = F::lost(&guard).unwrap_or_default();
    assert!(reason.contains("is not open any more"), "{reason:?}");
    drop(guard);
    drop(session);

    // The leader killed: keep-alives go on against the next one, and the
    // session's locks stay held.
    let ttl = Duration::from_secs(3);
    let session = a.session(ttl).await.unwrap();
    let lock = a.acquire_in(&session, "failover/lock", Duration::ZERO).await.unwrap();
    let reader = a.acquire_shared_in(&session, "failover/rw", Share::Read, Duration::ZERO).await.unwrap();
    let leader = cluster.leader(&leader_probe);
    cluster.kill(leader);
    tokio::time::sleep(2 * ttl + Duration::from_millis(500)).await;
    assert_eq!(F::session_lost(&session), None, "the session was lost across the leader's death");
    assert_eq!((F::lost(&lock), F::lost(&reader)), (None, None));
    assert!(matches!(
        b.acquire_raw(None, "failover/lock", None, ttl).await,
        Err(ClientError::Held { holder_token: Some(token) }) if token == F::token(&lock)
    ));
    assert!(matches!(
        b.acquire_raw(None, "failover/rw", Some(Share::Write), ttl).await,
        Err(ClientError::Held { .. })
    ));
    assert_eq!(a.keep_alive(F::session_id(&session)).await, Ok(true));
    assert_eq!(F::close(session).await, Ok(true));
    cluster.launch(leader);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blocking_client_holds_many_locks_under_one_session() {
    let mut cluster = Cluster::start(3);
    scenario::<Blocking>(&mut cluster, "blocking").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_client_holds_many_locks_under_one_session() {
    let mut cluster = Cluster::start(3);
    scenario::<Async>(&mut cluster, "async").await;
}

/// `get` and `list` name the session a holder is held under
/// (`LockInfo.session`), and its lease is the session's.
#[test]
fn holders_name_their_session() {
    let cluster = Cluster::start(3);
    let client = cluster.client();
    cluster.leader(&client);
    let session = client.session(Duration::from_secs(4)).unwrap();
    let _lock = client.acquire_in(&session, "named/lock", Duration::ZERO).unwrap();
    let _reader = client.acquire_shared_in(&session, "named/rw", Share::Read, Duration::ZERO).unwrap();
    let own = client.acquire("named/own", Duration::from_secs(4), Duration::ZERO).unwrap();
    for key in ["named/lock", "named/rw"] {
        let holders = client.holders(key, true).unwrap();
        assert_eq!(
            holders.iter().map(|holder| (holder.session, holder.lease_ms)).collect::<Vec<_>>(),
            [(Some(session.id()), 4_000)],
            "{key}: {holders:?}"
        );
    }
    assert_eq!(client.get("named/own", true).unwrap().map(|holder| holder.session), Some(None));
    let listed = client.list("named/", 0).unwrap();
    assert_eq!(
        listed.iter().map(|holder| (holder.key.as_slice(), holder.session)).collect::<Vec<_>>(),
        [
            (b"named/lock".as_slice(), Some(session.id())),
            (b"named/own", None),
            (b"named/rw", Some(session.id()))
        ],
        "{listed:?}"
    );
    drop(own);
}

/// The CLI: `session open`, `acquire --session`, `get`, `session
/// keepalive` (once and `--every`), `session close`, and exit code 4 for a
/// session that is not open.
#[test]
fn the_cli_opens_keeps_alive_and_closes_sessions() {
    let cluster = Cluster::start(3);
    let client = cluster.client();
    cluster.leader(&client);
    let endpoints = cluster.endpoints().join(",");
    let cli = |args: &[&str]| {
        let mut all = vec!["--endpoints", endpoints.as_str()];
        all.extend_from_slice(args);
        fencelock(&all)
    };
    let opened = cli(&["--json", "session", "open", "--ttl", "3s", "--owner", "cli-a"]);
    assert!(opened.status.success(), "{opened:?}");
    let json: serde_json::Value = serde_json::from_slice(&opened.stdout).unwrap();
    assert_eq!((json["ttl_ms"].as_u64(), json["owner"].as_str()), (Some(3_000), Some("cli-a")), "{json}");
    let id = json["session"].as_u64().unwrap().to_string();

    let acquired = cli(&["acquire", "cli/lock", "--session", &id, "--owner", "cli-a"]);
    assert!(acquired.status.success(), "{acquired:?}");
    let token: u64 = String::from_utf8_lossy(&acquired.stdout).trim().parse().unwrap();
    let reader = cli(&["--json", "acquire", "cli/rw", "--read", "--session", &id, "--owner", "cli-a"]);
    assert!(reader.status.success(), "{reader:?}");
    let reader: serde_json::Value = serde_json::from_slice(&reader.stdout).unwrap();
    assert_eq!(reader["session"].as_u64().map(|session| session.to_string()), Some(id.clone()));
    // Another owner under it: refused (1); the TTL is the session's.
    let theirs = cli(&["acquire", "cli/theirs", "--session", &id, "--owner", "cli-b"]);
    assert_eq!(theirs.status.code(), Some(1), "{theirs:?}");
    assert!(cli(&["acquire", "cli/x", "--session", &id, "--ttl", "3s"]).status.code() == Some(1));

    // One hold released by its token: the session and its other holds
    // stay, and the key can be taken again under it.
    let released = cli(&["release", "cli/lock", "--token", &token.to_string()]);
    assert!(released.status.success(), "{released:?}");
    assert_eq!(client.holders("cli/rw", true).unwrap().len(), 1);
    let again = cli(&["acquire", "cli/lock", "--session", &id, "--owner", "cli-a"]);
    assert!(again.status.success(), "{again:?}");
    let token: u64 = String::from_utf8_lossy(&again.stdout).trim().parse().unwrap();

    // Kept alive by a loop past its TTL.
    let mut keeper = std::process::Command::new(common::cli_binary())
        .args(["--endpoints", &endpoints, "session", "keepalive", &id, "--every", "1s"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(5));
    assert!(keeper.try_wait().unwrap().is_none(), "the keep-alive loop ended");
    assert!(client.check("cli/lock", token).unwrap(), "the lock lapsed while kept alive");
    let once = cli(&["session", "keepalive", &id]);
    assert!(once.status.success(), "{once:?}");
    assert!(String::from_utf8_lossy(&once.stdout).starts_with("kept alive for 3s"), "{once:?}");

    let closed = cli(&["session", "close", &id]);
    assert!(closed.status.success(), "{closed:?}");
    assert_eq!(String::from_utf8_lossy(&closed.stdout).trim(), "closed");
    assert!(!client.check("cli/lock", token).unwrap());
    assert!(client.holders("cli/rw", true).unwrap().is_empty());
    // The loop sees the session gone and exits 4.
    let status = {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(status) = keeper.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "the keep-alive loop went on after the close");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    assert_eq!(status.code(), Some(4));
    for args in [
        vec!["session", "keepalive", id.as_str()],
        vec!["session", "close", id.as_str()],
        vec!["acquire", "cli/lock", "--session", id.as_str(), "--owner", "cli-a"],
    ] {
        let gone = cli(&args);
        assert_eq!(gone.status.code(), Some(4), "{args:?}: {gone:?}");
        let said =
            format!("{}{}", String::from_utf8_lossy(&gone.stdout), String::from_utf8_lossy(&gone.stderr));
        assert!(said.contains("not open"), "{args:?}: {said}");
    }
    let json = cli(&["--json", "session", "keepalive", &id]);
    assert_eq!(json.status.code(), Some(4));
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["kept_alive"], serde_json::json!(false));
}

/// `get` shows `session=ID` for a holder under a session (a separate test:
/// it depends on the server filling `LockInfo.session`).
#[test]
fn the_cli_shows_the_session_of_a_holder() {
    let cluster = Cluster::start(3);
    let client = cluster.client();
    cluster.leader(&client);
    let endpoints = cluster.endpoints().join(",");
    let session = client.session(Duration::from_secs(5)).unwrap();
    let _lock = client.acquire_in(&session, "shown/lock", Duration::ZERO).unwrap();
    let shown = fencelock(&["--endpoints", &endpoints, "get", "shown/lock"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains(&format!(" session={}", session.id())), "{text}");
    let json = fencelock(&["--endpoints", &endpoints, "--json", "list", "shown/"]);
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(json["locks"][0]["session"].as_u64(), Some(session.id()), "{json}");
}
