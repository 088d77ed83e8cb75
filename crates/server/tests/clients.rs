//! The blocking client (`fencelock-client`) and the async one
//! (`fencelock-client-async`) pass the same behaviour tests against a real
//! 3-node cluster: one scenario, written once over a small [`Face`] trait,
//! run with each client.
//!
//! The scenario: a grant shows its time left (client and leader side), a
//! conflict names the holder's token, a retried acquire returns the same
//! token, tokens increase, two guards of one owner in one process never
//! share a lock, renewals keep a short lease alive, a refused renewal and a
//! lease that runs out unrenewed both fire the lost-lock signal, and a
//! leader killed with SIGKILL is followed to the next one.
//!
//! Two more scenarios, run the same way: an election (campaign, proclaim,
//! resign, the next candidate leads, an observer tells each leader and
//! value) and a watch of a prefix (each grant and release under it, in log
//! order, nothing from outside it).
//!
//! And two of shared keys: a read-write lock (two readers at once, a
//! writer queued behind them and granted only after both, every holder
//! listed) and a semaphore of 2 (two permits, a third turned away, then
//! granted the first permit released; another number of permits refused).

// Test code: unwrapping is how a test fails.
#![allow(clippy::unwrap_used)]

mod common;

use std::future::Future;
use std::time::{Duration, Instant};

use common::{Cluster, DEADLINE};
use fencelock_client::{
    Client, ClientConfig, ClientError, Grant, Leader, LeaderChange, LockGuard, LockInfo, Observer, Released,
    Share, ShareKind, Watch, WatchBatch, WatchEventKind,
};
use fencelock_client_async::{AsyncClient, AsyncLockGuard, AsyncObserver, AsyncWatch};

/// What the scenario needs of a client.
trait Face: Sized + Send + Sync + 'static {
    type Guard: Held;
    type Observer: Follows;
    type Watch: Watches;
    fn make(config: ClientConfig) -> Self;
    fn acquire(
        &self,
        key: &str,
        lease: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<Self::Guard, ClientError>> + Send;
    fn acquire_raw(
        &self,
        owner: &str,
        key: &str,
        lease: Duration,
    ) -> impl Future<Output = Result<Grant, ClientError>> + Send;
    fn release(&self, key: &str, token: u64) -> impl Future<Output = Result<Released, ClientError>> + Send;
    fn force_release(&self, key: &str) -> impl Future<Output = Result<bool, ClientError>> + Send;
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<LockInfo>, ClientError>> + Send;
    fn check(&self, key: &str, token: u64) -> impl Future<Output = Result<bool, ClientError>> + Send;
    fn campaign(
        &self,
        election: &str,
        value: &str,
        lease: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<Self::Guard, ClientError>> + Send;
    fn proclaim(
        &self,
        key: &str,
        token: u64,
        value: &str,
    ) -> impl Future<Output = Result<Released, ClientError>> + Send;
    fn observe(&self, election: &str) -> Self::Observer;
    /// A watch of `prefix` from now (`None`) or from a position.
    fn watch(&self, prefix: &str, from: Option<u64>) -> Self::Watch;
    fn acquire_shared(
        &self,
        key: &str,
        share: Share,
        lease: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<Self::Guard, ClientError>> + Send;
    fn acquire_shared_as(
        &self,
        owner: &str,
        key: &str,
        share: Share,
        lease: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<Self::Guard, ClientError>> + Send;
    fn acquire_as(
        &self,
        owner: &str,
        key: &str,
        lease: Duration,
        wait: Duration,
    ) -> impl Future<Output = Result<Self::Guard, ClientError>> + Send;
    /// A shared acquire that does not wait.
    fn acquire_shared_raw(
        &self,
        owner: &str,
        key: &str,
        share: Share,
        lease: Duration,
    ) -> impl Future<Output = Result<Grant, ClientError>> + Send;
    fn holders(&self, key: &str) -> impl Future<Output = Result<Vec<LockInfo>, ClientError>> + Send;
}

/// What the election scenario needs of an observer.
trait Follows: Send {
    fn next(
        &mut self,
        wait: Duration,
    ) -> impl Future<Output = Result<Option<LeaderChange>, ClientError>> + Send;
}

/// What the watch scenario needs of a watch.
trait Watches: Send {
    fn next(&mut self, wait: Duration) -> impl Future<Output = Result<WatchBatch, ClientError>> + Send;
    fn position(&self) -> Option<u64>;
}

/// What the scenario needs of a guard.
trait Held: Send + Sync + 'static {
    fn token(&self) -> u64;
    fn time_left(&self) -> Duration;
    fn is_lost(&self) -> bool;
    /// The reason, if the lock is seen lost within `within`.
    fn lost_within(&self, within: Duration) -> impl Future<Output = Option<String>> + Send;
    fn release(self) -> impl Future<Output = Result<bool, ClientError>> + Send;
    fn proclaim(&self, value: &str) -> impl Future<Output = Result<bool, ClientError>> + Send;
}

/// The blocking client, its calls made off the runtime's async path.
struct Blocking(Client);

fn blocking<T>(call: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(call)
}

impl Face for Blocking {
    type Guard = LockGuard;
    type Observer = Observer;
    type Watch = Watch;
    fn make(config: ClientConfig) -> Self {
        Blocking(Client::connect(config).unwrap())
    }
    async fn acquire(&self, key: &str, lease: Duration, wait: Duration) -> Result<LockGuard, ClientError> {
        blocking(|| self.0.acquire(key, lease, wait))
    }
    async fn acquire_raw(&self, owner: &str, key: &str, lease: Duration) -> Result<Grant, ClientError> {
        blocking(|| self.0.acquire_raw(owner.as_bytes(), key, lease, Duration::ZERO))
    }
    async fn release(&self, key: &str, token: u64) -> Result<Released, ClientError> {
        blocking(|| self.0.release_outcome(key, token))
    }
    async fn force_release(&self, key: &str) -> Result<bool, ClientError> {
        blocking(|| self.0.force_release(key))
    }
    async fn get(&self, key: &str) -> Result<Option<LockInfo>, ClientError> {
        blocking(|| self.0.get(key, true))
    }
    async fn check(&self, key: &str, token: u64) -> Result<bool, ClientError> {
        blocking(|| self.0.check(key, token))
    }
    async fn campaign(
        &self,
        election: &str,
        value: &str,
        lease: Duration,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        blocking(|| self.0.campaign(election, value, lease, wait))
    }
    async fn proclaim(&self, key: &str, token: u64, value: &str) -> Result<Released, ClientError> {
        blocking(|| self.0.proclaim(key, token, value))
    }
    fn observe(&self, election: &str) -> Observer {
        self.0.observe(election)
    }
    fn watch(&self, prefix: &str, from: Option<u64>) -> Watch {
        match from {
            None => self.0.watch(prefix),
            Some(position) => self.0.watch_from(prefix, position),
        }
    }
    async fn acquire_shared(
        &self,
        key: &str,
        share: Share,
        lease: Duration,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        blocking(|| self.0.acquire_shared(key, share, lease, wait))
    }
    async fn acquire_shared_as(
        &self,
        owner: &str,
        key: &str,
        share: Share,
        lease: Duration,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        blocking(|| self.0.acquire_shared_as(owner.as_bytes(), key, share, lease, wait))
    }
    async fn acquire_as(
        &self,
        owner: &str,
        key: &str,
        lease: Duration,
        wait: Duration,
    ) -> Result<LockGuard, ClientError> {
        blocking(|| self.0.acquire_as(owner.as_bytes(), key, lease, wait))
    }
    async fn acquire_shared_raw(
        &self,
        owner: &str,
        key: &str,
        share: Share,
        lease: Duration,
    ) -> Result<Grant, ClientError> {
        blocking(|| self.0.acquire_shared_raw(owner.as_bytes(), key, share, lease, Duration::ZERO))
    }
    async fn holders(&self, key: &str) -> Result<Vec<LockInfo>, ClientError> {
        blocking(|| self.0.holders(key, true))
    }
}

impl Follows for Observer {
    async fn next(&mut self, wait: Duration) -> Result<Option<LeaderChange>, ClientError> {
        blocking(|| Observer::next(self, wait))
    }
}

impl Watches for Watch {
    async fn next(&mut self, wait: Duration) -> Result<WatchBatch, ClientError> {
        blocking(|| Watch::next(self, wait))
    }
    fn position(&self) -> Option<u64> {
        Watch::position(self)
    }
}

impl Held for LockGuard {
    fn token(&self) -> u64 {
        LockGuard::token(self)
    }
    fn time_left(&self) -> Duration {
        LockGuard::time_left(self)
    }
    fn is_lost(&self) -> bool {
        LockGuard::is_lost(self)
    }
    async fn lost_within(&self, within: Duration) -> Option<String> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Some(reason) = self.lost_reason() {
                return Some(reason);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.lost_reason()
    }
    async fn release(self) -> Result<bool, ClientError> {
        blocking(|| LockGuard::release(self))
    }
    async fn proclaim(&self, value: &str) -> Result<bool, ClientError> {
        blocking(|| LockGuard::proclaim(self, value))
    }
}

struct Async(AsyncClient);

impl Face for Async {
    type Guard = AsyncLockGuard;
    type Observer = AsyncObserver;
    type Watch = AsyncWatch;
    fn make(config: ClientConfig) -> Self {
        Async(AsyncClient::connect(config).unwrap())
    }
    async fn acquire(
        &self,
        key: &str,
        lease: Duration,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        self.0.acquire(key, lease, wait).await
    }
    async fn acquire_raw(&self, owner: &str, key: &str, lease: Duration) -> Result<Grant, ClientError> {
        self.0.acquire_raw(owner.as_bytes(), key, lease, Duration::ZERO).await
    }
    async fn release(&self, key: &str, token: u64) -> Result<Released, ClientError> {
        self.0.release_outcome(key, token).await
    }
    async fn force_release(&self, key: &str) -> Result<bool, ClientError> {
        self.0.force_release(key).await
    }
    async fn get(&self, key: &str) -> Result<Option<LockInfo>, ClientError> {
        self.0.get(key, true).await
    }
    async fn check(&self, key: &str, token: u64) -> Result<bool, ClientError> {
        self.0.check(key, token).await
    }
    async fn campaign(
        &self,
        election: &str,
        value: &str,
        lease: Duration,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        self.0.campaign(election, value, lease, wait).await
    }
    async fn proclaim(&self, key: &str, token: u64, value: &str) -> Result<Released, ClientError> {
        self.0.proclaim(key, token, value).await
    }
    fn observe(&self, election: &str) -> AsyncObserver {
        self.0.observe(election)
    }
    fn watch(&self, prefix: &str, from: Option<u64>) -> AsyncWatch {
        match from {
            None => self.0.watch(prefix),
            Some(position) => self.0.watch_from(prefix, position),
        }
    }
    async fn acquire_shared(
        &self,
        key: &str,
        share: Share,
        lease: Duration,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        self.0.acquire_shared(key, share, lease, wait).await
    }
    async fn acquire_shared_as(
        &self,
        owner: &str,
        key: &str,
        share: Share,
        lease: Duration,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        self.0.acquire_shared_as(owner.as_bytes(), key, share, lease, wait).await
    }
    async fn acquire_as(
        &self,
        owner: &str,
        key: &str,
        lease: Duration,
        wait: Duration,
    ) -> Result<AsyncLockGuard, ClientError> {
        self.0.acquire_as(owner.as_bytes(), key, lease, wait).await
    }
    async fn acquire_shared_raw(
        &self,
        owner: &str,
        key: &str,
        share: Share,
        lease: Duration,
    ) -> Result<Grant, ClientError> {
        self.0.acquire_shared_raw(owner.as_bytes(), key, share, lease, Duration::ZERO).await
    }
    async fn holders(&self, key: &str) -> Result<Vec<LockInfo>, ClientError> {
        self.0.holders(key, true).await
    }
}

impl Follows for AsyncObserver {
    async fn next(&mut self, wait: Duration) -> Result<Option<LeaderChange>, ClientError> {
        AsyncObserver::next(self, wait).await
    }
}

impl Watches for AsyncWatch {
    async fn next(&mut self, wait: Duration) -> Result<WatchBatch, ClientError> {
        AsyncWatch::next(self, wait).await
    }
    fn position(&self) -> Option<u64> {
        AsyncWatch::position(self)
    }
}

impl Held for AsyncLockGuard {
    fn token(&self) -> u64 {
        AsyncLockGuard::token(self)
    }
    fn time_left(&self) -> Duration {
        AsyncLockGuard::time_left(self)
    }
    fn is_lost(&self) -> bool {
        AsyncLockGuard::is_lost(self)
    }
    async fn lost_within(&self, within: Duration) -> Option<String> {
        tokio::time::timeout(within, self.lost()).await.ok()
    }
    async fn release(self) -> Result<bool, ClientError> {
        AsyncLockGuard::release(self).await
    }
    async fn proclaim(&self, value: &str) -> Result<bool, ClientError> {
        AsyncLockGuard::proclaim(self, value).await
    }
}

fn config(cluster: &Cluster, owner: &str) -> ClientConfig {
    let mut config = ClientConfig::new(cluster.endpoints());
    config.request_timeout = Duration::from_secs(2);
    config.retry_for = DEADLINE;
    config.owner = Some(owner.as_bytes().to_vec());
    config
}

/// The whole scenario, with clients of kind `F`.
/// Owners are named after `face`: the registry of keys held in this
/// process is the process's, whichever cluster a client talks to, and the
/// faces' tests run side by side.
async fn scenario<F: Face>(cluster: &mut Cluster, face: &str) {
    let one = F::make(config(cluster, &format!("{face}-one")));
    let two = F::make(config(cluster, &format!("{face}-two")));
    let drift = fencelock_client::Drift::default();
    let mut tokens = Vec::new();

    // A grant, its time left on both sides, a conflict naming the holder.
    let lease = Duration::from_secs(3);
    let asked = Instant::now();
    let guard = one.acquire("a", lease, Duration::ZERO).await.unwrap();
    let left = guard.time_left();
    assert!(left > Duration::ZERO && left <= drift.usable(lease), "{left:?}");
    assert!(left + asked.elapsed() >= drift.usable(lease), "{left:?} counts from before the send");
    let info = one.get("a").await.unwrap().expect("a is held");
    assert_eq!((info.token, info.owner.as_slice()), (guard.token(), format!("{face}-one").as_bytes()));
    assert!(info.remaining_ms > 0 && info.remaining_ms <= 3_000, "{info:?}");
    let holder = Some(guard.token());
    assert_eq!(
        two.acquire("a", lease, Duration::ZERO).await.err(),
        Some(ClientError::Held { holder_token: holder })
    );
    let waited = two.acquire("a", lease, Duration::from_millis(300)).await.err();
    assert_eq!(waited, Some(ClientError::WaitTimedOut { holder_token: holder }));
    // The wrong token is told which one holds the key.
    let wrong = two.release("a", guard.token() + 1_000).await.unwrap();
    assert_eq!(wrong, Released { released: false, holder_token: holder });
    tokens.push(guard.token());
    assert!(guard.release().await.unwrap());
    assert_eq!(one.get("a").await.unwrap(), None);

    // A retried acquire by the same owner gets the same token back.
    let first = one.acquire_raw(&format!("{face}-retrying"), "b", lease).await.unwrap();
    let again = one.acquire_raw(&format!("{face}-retrying"), "b", lease).await.unwrap();
    assert_eq!((again.token, again.existing, first.existing), (first.token, true, false));
    tokens.push(first.token);
    assert!(one.release("b", first.token).await.unwrap().released);

    // A guard under a named owner: held as that owner, renewed and
    // released like any guard.
    let named = format!("{face}-named");
    let guard = one.acquire_as(&named, "b", lease, Duration::ZERO).await.unwrap();
    let info = one.get("b").await.unwrap().expect("b is held");
    assert_eq!((info.token, info.owner.as_slice()), (guard.token(), named.as_bytes()));
    tokens.push(guard.token());
    assert!(guard.release().await.unwrap());

    // Two guards of one owner in one process: the second waits or fails,
    // never shares.
    let held = one.acquire("c", lease, Duration::ZERO).await.unwrap();
    let second = one.acquire("c", lease, Duration::ZERO).await.err();
    assert_eq!(second, Some(ClientError::Held { holder_token: Some(held.token()) }));
    let first_token = held.token();
    // The release runs in a task of its own: the blocking face's waiter
    // holds its thread while it waits.
    let dropper = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(300)).await;
        held.release().await.unwrap()
    });
    let after = one.acquire("c", lease, Duration::from_secs(20)).await.unwrap();
    assert!(dropper.await.unwrap());
    assert!(after.token() > first_token, "{} after {first_token}: a fresh grant", after.token());
    tokens.extend([first_token, after.token()]);
    after.release().await.unwrap();

    // Renewals keep a short lease alive well past it.
    let short = Duration::from_secs(1);
    let kept = one.acquire("d", short, Duration::ZERO).await.unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    assert!(!kept.is_lost(), "a renewed lock was reported lost");
    assert!(one.check("d", kept.token()).await.unwrap());
    assert!(kept.time_left() > Duration::ZERO);

    // A refused renewal fires the lost-lock signal.
    assert!(two.force_release("d").await.unwrap());
    let reason =
        kept.lost_within(Duration::from_secs(3)).await.expect("the refused renewal was not signalled");
    assert!(reason.contains("renewal refused"), "{reason}");
    assert_eq!(kept.time_left(), Duration::ZERO);
    tokens.push(kept.token());

    // A leader killed with SIGKILL: calls follow to the next leader, a held
    // lock is either still held or reported lost, and tokens go on rising.
    let long = one.acquire("e", Duration::from_secs(6), Duration::ZERO).await.unwrap();
    tokens.push(long.token());
    let leader = cluster.leader(&cluster.client());
    cluster.kill(leader);
    let fresh = two.acquire("f", lease, Duration::ZERO).await.unwrap();
    tokens.push(fresh.token());
    tokio::time::sleep(Duration::from_secs(2)).await;
    if !long.is_lost() {
        assert!(one.check("e", long.token()).await.unwrap(), "a lock not seen lost was not held");
    }
    assert!(tokens.windows(2).all(|pair| pair[0] < pair[1]), "tokens did not increase: {tokens:?}");
    drop(fresh);
    drop(long);

    // No quorum: a lease that runs out unrenewed fires the signal too.
    let stranded = one.acquire("g", short, Duration::ZERO).await.unwrap();
    let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    cluster.kill(others[0]);
    let reason =
        stranded.lost_within(Duration::from_secs(5)).await.expect("the lapsed lease was not signalled");
    assert_eq!(reason, "the lease ran out before a renewal succeeded");
    assert!(stranded.is_lost());
}

/// The next change an observer tells, within 5 s.
async fn told(observer: &mut impl Follows) -> LeaderChange {
    observer.next(Duration::from_secs(5)).await.unwrap().expect("no change of leader told within 5 s")
}

/// The election scenario, with clients of kind `F`: candidate A leads with
/// "a:1" while B waits in the queue, an observer tells A and then A's
/// proclaimed "a:2"; A resigns, B leads with a greater token and a lease it
/// can count on (it waited longer than half of it), the observer tells B,
/// and A's old token can no longer proclaim.
async fn election<F: Face>(cluster: &Cluster, face: &str) {
    let election = "svc/leader";
    let (owner_a, owner_b) = (format!("{face}-candidate-a"), format!("{face}-candidate-b"));
    let a = F::make(config(cluster, &owner_a));
    let b = F::make(config(cluster, &owner_b));
    let watcher = F::make(config(cluster, &format!("{face}-observer")));
    let lease = Duration::from_secs(3);
    let leader = |token, owner: &str, value: &str| {
        Some(Leader { token, owner: owner.as_bytes().to_vec(), value: value.as_bytes().to_vec() })
    };

    let lead_a = a.campaign(election, "a:1", lease, Duration::ZERO).await.unwrap();
    let token_a = lead_a.token();
    let waiting = tokio::spawn(async move {
        let lead = b.campaign(election, "b:1", lease, Duration::from_secs(20)).await;
        (b, lead)
    });

    // The observer may ask a node that has not applied A's grant yet: it
    // then tells "no leader" first.
    let mut observer = watcher.observe(election);
    let mut first = told(&mut observer).await;
    if first.leader.is_none() {
        first = told(&mut observer).await;
    }
    assert_eq!(first.leader, leader(token_a, &owner_a, "a:1"));
    assert!(lead_a.proclaim("a:2").await.unwrap());
    let proclaimed = told(&mut observer).await;
    assert_eq!(proclaimed.leader, leader(token_a, &owner_a, "a:2"));
    assert!(proclaimed.index > first.index, "{proclaimed:?} after {first:?}");

    // B waits in the queue for longer than half its usable lease: the lease
    // it was granted would be mostly gone, counted from its send time.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!waiting.is_finished(), "B was answered while A led");
    assert!(lead_a.release().await.unwrap());
    let (_b, lead_b) = waiting.await.unwrap();
    let lead_b = lead_b.unwrap();
    assert!(lead_b.token() > token_a, "{} after {token_a}", lead_b.token());
    let usable = fencelock_client::Drift::default().usable(lease);
    assert!(lead_b.time_left() > usable / 2, "{:?} left after the wait", lead_b.time_left());

    // A's release frees the key before B's grant: "no leader" may be told
    // (at the same index when the hand-over is in the release's entry).
    let mut change = told(&mut observer).await;
    assert!(change.index > proclaimed.index, "{change:?} after {proclaimed:?}");
    if change.leader.is_none() {
        let next = told(&mut observer).await;
        assert!(next.index >= change.index, "{next:?} after {change:?}");
        change = next;
    }
    assert_eq!(change.leader, leader(lead_b.token(), &owner_b, "b:1"));

    // A's old token proclaims no more, and is told which token leads.
    let stale = a.proclaim(election, token_a, "a:3").await.unwrap();
    assert_eq!(stale, Released { released: false, holder_token: Some(lead_b.token()) });
    assert_eq!(observer.next(Duration::from_millis(300)).await.unwrap(), None);
    assert!(lead_b.release().await.unwrap());
    assert_eq!(told(&mut observer).await.leader, None);
}

/// The changes a watch tells until there are `count`, within 5 s; each
/// answer moves its position past its events.
async fn changes(watch: &mut impl Watches, count: usize) -> Vec<fencelock_client::WatchEvent> {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut events = Vec::new();
    while events.len() < count {
        assert!(Instant::now() < deadline, "only {events:?} within 5 s");
        let batch = watch.next(Duration::from_secs(1)).await.unwrap();
        assert!(!batch.compacted && batch.current.is_none(), "{batch:?}");
        assert!(batch.events.iter().all(|event| event.index <= batch.index), "{batch:?}");
        assert_eq!(watch.position(), Some(batch.index));
        events.extend(batch.events);
    }
    events
}

/// The watch scenario, with clients of kind `F`: a watch of `jobs/` starts
/// with no holders, then tells the grants and releases of two keys under
/// it, in log order at increasing indexes, and nothing of a key outside it;
/// a watch from the start position tells the same changes again.
async fn watching<F: Face>(cluster: &Cluster, face: &str) {
    let watcher = F::make(config(cluster, &format!("{face}-watcher")));
    let writer = F::make(config(cluster, &format!("{face}-writer")));
    let owner = format!("{face}-worker");
    let mut watch = watcher.watch("jobs/", None);
    assert_eq!(watch.position(), None);
    let start = watch.next(Duration::from_secs(1)).await.unwrap();
    assert_eq!((start.current.as_deref(), start.events.as_slice()), (Some(&[][..]), &[][..]));
    assert_eq!(watch.position(), Some(start.index));

    let lease = Duration::from_secs(10);
    let x = writer.acquire_raw(&owner, "jobs/x", lease).await.unwrap().token;
    let outside = writer.acquire_raw(&owner, "other/z", lease).await.unwrap().token;
    let y = writer.acquire_raw(&owner, "jobs/y", lease).await.unwrap().token;
    assert!(writer.release("jobs/x", x).await.unwrap().released);
    assert!(writer.release("other/z", outside).await.unwrap().released);
    assert!(writer.release("jobs/y", y).await.unwrap().released);

    let events = changes(&mut watch, 4).await;
    let told: Vec<_> = events.iter().map(|event| (event.kind, event.key.as_slice(), event.token)).collect();
    assert_eq!(
        told,
        [
            (WatchEventKind::Granted, &b"jobs/x"[..], x),
            (WatchEventKind::Granted, &b"jobs/y"[..], y),
            (WatchEventKind::Released, &b"jobs/x"[..], x),
            (WatchEventKind::Released, &b"jobs/y"[..], y),
        ]
    );
    assert!(events.iter().all(|event| event.owner == owner.as_bytes()), "{events:?}");
    let indexes: Vec<u64> = events.iter().map(|event| event.index).collect();
    assert!(start.index < indexes[0], "{indexes:?} after {}", start.index);
    assert!(indexes.windows(2).all(|pair| pair[0] < pair[1]), "{indexes:?}");
    // Nothing more under the prefix: other/z is not told.
    let quiet = watch.next(Duration::from_millis(300)).await.unwrap();
    assert!(quiet.events.is_empty(), "{quiet:?}");

    let mut again = watcher.watch("jobs/", Some(start.index));
    assert_eq!(changes(&mut again, 4).await, events);
}

/// Each holder as `(token, owner, share, permits)`.
fn holding(holders: &[LockInfo]) -> Vec<(u64, String, ShareKind, u32)> {
    holders
        .iter()
        .map(|info| (info.token, String::from_utf8_lossy(&info.owner).into_owned(), info.share, info.permits))
        .collect()
}

/// The message of an invalid-argument error.
fn invalid(error: Option<ClientError>) -> String {
    match error {
        Some(ClientError::InvalidArgument(message)) => message,
        other => panic!("not refused as an invalid argument: {other:?}"),
    }
}

/// The read-write lock scenario, with clients of kind `F`: two readers hold
/// `db/schema` at once under tokens of their own. A writer that waits is
/// queued behind them (a later reader that does not wait is then turned
/// away rather than pass it), is not granted while one reader is left, and
/// is granted once both released, with a greater token and a lease it can
/// count on (it waited longer than half of it). `holders` lists every
/// holder; another kind on the key is refused.
async fn read_write<F: Face>(cluster: &Cluster, face: &str) {
    let key = "db/schema";
    let [owner_1, owner_2, owner_w] = ["reader-1", "reader-2", "writer"].map(|who| format!("{face}-{who}"));
    let [reader_1, reader_2, writer] =
        [&owner_1, &owner_2, &owner_w].map(|owner| F::make(config(cluster, owner)));
    let lease = Duration::from_secs(3);

    let r1 = reader_1.acquire_shared(key, Share::Read, lease, Duration::ZERO).await.unwrap();
    let r2 = reader_2.acquire_shared(key, Share::Read, lease, Duration::ZERO).await.unwrap();
    assert!(r1.token() < r2.token(), "{} then {}", r1.token(), r2.token());
    assert!(reader_1.check(key, r1.token()).await.unwrap());
    assert!(reader_1.check(key, r2.token()).await.unwrap());
    assert_eq!(
        holding(&reader_2.holders(key).await.unwrap()),
        [
            (r1.token(), owner_1.clone(), ShareKind::Read, 0),
            (r2.token(), owner_2.clone(), ShareKind::Read, 0)
        ]
    );

    let waiting = tokio::spawn(async move {
        let guard = writer.acquire_shared(key, Share::Write, lease, Duration::from_secs(20)).await;
        (writer, guard)
    });
    // The writer is queued once a reader that does not wait is turned away
    // (one that came before it is granted: let go, and asked again).
    let late = format!("{face}-reader-late");
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match reader_1.acquire_shared_raw(&late, key, Share::Read, lease).await {
            Ok(grant) => assert!(reader_1.release(key, grant.token).await.unwrap().released),
            Err(refused) => {
                assert_eq!(refused, ClientError::Held { holder_token: Some(r1.token()) });
                break;
            }
        }
        assert!(Instant::now() < deadline, "a writer never queued: readers still pass it");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The writer waits on, with one reader left, for longer than half its
    // usable lease: the lease it is granted would be mostly gone, counted
    // from its send time.
    let readers_last = r2.token();
    assert!(r1.release().await.unwrap());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!waiting.is_finished(), "the writer got in beside a reader");
    assert!(r2.release().await.unwrap());
    let (writer, w) = waiting.await.unwrap();
    let w = w.unwrap();
    assert!(w.token() > readers_last, "{} after {readers_last}", w.token());
    let usable = fencelock_client::Drift::default().usable(lease);
    assert!(w.time_left() > usable / 2, "{:?} left after the wait", w.time_left());
    assert_eq!(holding(&writer.holders(key).await.unwrap()), [(w.token(), owner_w, ShareKind::Write, 0)]);

    // Another kind on a read-write lock's key.
    let refused = invalid(reader_1.acquire_shared(key, Share::Permit(2), lease, Duration::ZERO).await.err());
    assert!(refused.contains("read-write lock"), "{refused}");
    assert_eq!(
        reader_1.acquire(key, lease, Duration::ZERO).await.err(),
        Some(ClientError::Held { holder_token: Some(w.token()) })
    );
    assert!(w.release().await.unwrap());
    assert_eq!(writer.holders(key).await.unwrap(), []);
}

/// The semaphore scenario, with clients of kind `F`: a semaphore of 2
/// grants two permits (two owners of one client), a third that does not
/// wait is refused as held, one that waits is granted the first permit
/// released; a second guard of one owner, another number of permits and
/// another kind are refused.
async fn semaphore<F: Face>(cluster: &Cluster, face: &str) {
    let key = "pool";
    let [owner_a, owner_b, owner_c] = ["a", "b", "c"].map(|who| format!("{face}-permit-{who}"));
    let permits = F::make(config(cluster, &format!("{face}-permits")));
    let third = F::make(config(cluster, &owner_c));
    let lease = Duration::from_secs(3);
    let two = Share::Permit(2);

    let a = permits.acquire_shared_as(&owner_a, key, two, lease, Duration::ZERO).await.unwrap();
    let b = permits.acquire_shared_as(&owner_b, key, two, lease, Duration::ZERO).await.unwrap();
    assert!(a.token() < b.token(), "{} then {}", a.token(), b.token());
    assert_eq!(
        holding(&third.holders(key).await.unwrap()),
        [
            (a.token(), owner_a.clone(), ShareKind::Permit, 2),
            (b.token(), owner_b.clone(), ShareKind::Permit, 2)
        ]
    );
    let full = Some(ClientError::Held { holder_token: Some(a.token()) });
    assert_eq!(third.acquire_shared(key, two, lease, Duration::ZERO).await.err(), full);
    // One guard per key and owner in a process, shared or not.
    assert_eq!(permits.acquire_shared_as(&owner_a, key, two, lease, Duration::ZERO).await.err(), full);
    // The number of permits is the first acquire's; the kind too.
    let three = invalid(third.acquire_shared_raw(&owner_c, key, Share::Permit(3), lease).await.err());
    assert!(three.contains("semaphore of 2 permits"), "{three}");
    let read = invalid(third.acquire_shared(key, Share::Read, lease, Duration::ZERO).await.err());
    assert!(read.contains("semaphore of 2 permits"), "{read}");
    assert_eq!(third.acquire(key, lease, Duration::ZERO).await.err(), full);

    let waiting = tokio::spawn(async move {
        let guard = third.acquire_shared(key, two, lease, Duration::from_secs(20)).await;
        (third, guard)
    });
    // Time for a wrong grant to show: the third waits while both permits
    // are held.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "a third permit was granted on a semaphore of 2");
    assert!(a.release().await.unwrap());
    let (third, c) = waiting.await.unwrap();
    let c = c.unwrap();
    assert!(c.token() > b.token(), "{} after {}", c.token(), b.token());
    assert_eq!(
        holding(&third.holders(key).await.unwrap()),
        [(b.token(), owner_b, ShareKind::Permit, 2), (c.token(), owner_c, ShareKind::Permit, 2)]
    );
    assert!(b.release().await.unwrap());
    assert!(c.release().await.unwrap());
    assert_eq!(third.holders(key).await.unwrap(), []);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blocking_client_shares_a_read_write_lock() {
    let cluster = Cluster::start(3);
    read_write::<Blocking>(&cluster, "blocking").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_client_shares_a_read_write_lock() {
    let cluster = Cluster::start(3);
    read_write::<Async>(&cluster, "async").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blocking_client_holds_permits_of_a_semaphore() {
    let cluster = Cluster::start(3);
    semaphore::<Blocking>(&cluster, "blocking").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_client_holds_permits_of_a_semaphore() {
    let cluster = Cluster::start(3);
    semaphore::<Async>(&cluster, "async").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blocking_client_runs_an_election() {
    let cluster = Cluster::start(3);
    election::<Blocking>(&cluster, "blocking").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_client_runs_an_election() {
    let cluster = Cluster::start(3);
    election::<Async>(&cluster, "async").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blocking_client_watches_a_prefix() {
    let cluster = Cluster::start(3);
    watching::<Blocking>(&cluster, "blocking").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_client_watches_a_prefix() {
    let cluster = Cluster::start(3);
    watching::<Async>(&cluster, "async").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_blocking_client_passes_the_behaviour_tests() {
    let mut cluster = Cluster::start(3);
    scenario::<Blocking>(&mut cluster, "blocking").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_async_client_passes_the_behaviour_tests() {
    let mut cluster = Cluster::start(3);
    scenario::<Async>(&mut cluster, "async").await;
}

/// A blocking guard and an async guard of one owner in one process never
/// share a lock either: they meet in the same registry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_and_async_guards_of_one_owner_never_share_a_lock() {
    let cluster = Cluster::start(3);
    let sync = Blocking::make(config(&cluster, "both-faces"));
    let lease = Duration::from_secs(3);
    let held = sync.acquire("shared", lease, Duration::ZERO).await.unwrap();
    let async_face = Async::make(config(&cluster, "both-faces"));
    let refused = async_face.acquire("shared", lease, Duration::ZERO).await.err();
    assert_eq!(refused, Some(ClientError::Held { holder_token: Some(held.token()) }));
    let token = held.token();
    Held::release(held).await.unwrap();
    let after = async_face.acquire("shared", lease, Duration::ZERO).await.unwrap();
    assert!(after.token() > token);
    // Dropped, not released: the release runs in a task, and holds the key
    // for this process until it is done, so the blocking face then gets a
    // fresh grant rather than the async guard's lock.
    let async_token = after.token();
    drop(after);
    let next = sync.acquire("shared", lease, Duration::from_secs(10)).await.unwrap();
    assert!(next.token() > async_token);
}
