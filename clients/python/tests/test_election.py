"""Lock values, leader election (campaign, proclaim, observe) and watches,
against real fencelockd clusters."""

import threading
import time
import uuid

import pytest

import fencelock
import fencelock.client


def _name(what: str) -> str:
    """A key prefix of this test's own on the shared cluster."""
    return f"{what}-{uuid.uuid4().hex[:8]}/"


def test_a_lock_carries_its_value_and_a_retry_keeps_it(cluster):
    client = cluster.client()
    prefix = _name("value")
    with client.lock(prefix + "a", ttl=10, value="10.0.0.1:80") as lock:
        info = client.get(prefix + "a")
        assert info is not None and info.value == b"10.0.0.1:80" and info.token == lock.token
        # The value of one holder travels in list answers too.
        assert [i.value for i in client.list(prefix)] == [b"10.0.0.1:80"]
    # A retried acquire by the same owner keeps the value the lock has.
    first = client.acquire_raw(prefix + "b", ttl=10, value=b"first")
    again = client.acquire_raw(prefix + "b", ttl=10, value=b"second")
    assert again.existing and again.token == first.token
    assert client.get(prefix + "b").value == b"first"
    assert client.release(prefix + "b", first.token)
    # No value: empty.
    with client.lock(prefix + "c", ttl=10):
        assert client.get(prefix + "c").value == b""


def test_a_value_over_4096_bytes_is_refused(cluster):
    client = cluster.client()
    prefix = _name("big")
    with client.lock(prefix + "max", ttl=10, value=b"v" * 4096) as lock:
        assert client.get(prefix + "max").value == b"v" * 4096
        with pytest.raises(fencelock.InvalidArgument):
            lock.proclaim(b"v" * 4097)
        assert client.get(prefix + "max").value == b"v" * 4096
    with pytest.raises(fencelock.InvalidArgument):
        with client.lock(prefix + "over", ttl=10, value=b"v" * 4097):
            pass
    with pytest.raises(fencelock.InvalidArgument):
        client.campaign(prefix + "election", "x" * 4097, ttl=10, wait=0)
    assert client.list(prefix) == []


def test_proclaim_with_a_stale_token_returns_false(cluster):
    first = cluster.client()
    second = cluster.client()
    key = _name("stale") + "election"
    # A free key: nothing to proclaim.
    assert first.proclaim(key, 1, "x") is False
    lock = first.campaign(key, "a", ttl=10)
    assert lock.proclaim("a2") is True
    stale_token = lock.token
    lock.release()
    assert lock.proclaim("a3") is False
    with second.campaign(key, "b", ttl=10) as newer:
        assert newer.token > stale_token
        assert first.proclaim(key, stale_token, "a4") is False
        assert second.get(key).value == b"b"
        assert second.proclaim(key, newer.token, "b2") is True
        assert second.get(key).value == b"b2"


def test_two_candidates_and_an_observer(cluster, monkeypatch):
    # Waiting candidates ask again in short rounds here, as they would
    # every 30 s: the campaign goes on across them.
    monkeypatch.setattr(fencelock.client, "CAMPAIGN_ROUND", 0.3)
    election = _name("election") + "leader"
    a_client, b_client, watcher = cluster.client(), cluster.client(), cluster.client()
    observer = watcher.observe(election)
    # The first call tells who leads now: no one.
    now = observer.next(0)
    assert now == fencelock.LeaderChange(None, observer.position) and now.index > 0
    assert observer.next(0) is None

    a = a_client.campaign(election, "a:1", ttl=10)
    b_led = {}

    def campaign_b():
        b_led["lock"] = b_client.campaign(election, b"b:1", ttl=10)

    b_thread = threading.Thread(target=campaign_b, daemon=True)
    b_thread.start()
    time.sleep(0.8)  # B has asked more than once meanwhile
    assert "lock" not in b_led
    # Another candidate with a finite wait gives up as lock() does.
    with pytest.raises(fencelock.WaitTimedOut) as timed_out:
        watcher.campaign(election, "c", ttl=10, wait=0.4)
    assert timed_out.value.holder_token == a.token
    with pytest.raises(fencelock.Held):
        watcher.campaign(election, "c", ttl=10, wait=0)

    assert a.proclaim("a:2") is True
    a.release()  # resigns
    b_thread.join(10)
    b = b_led["lock"]
    assert b.token > a.token and not b.is_lost()

    told = []
    while len(told) < 4:
        change = observer.next(5.0)
        assert change is not None, told
        told.append(change)
    assert [c.leader for c in told] == [
        fencelock.Leader(a.token, a_client.owner, b"a:1"),
        fencelock.Leader(a.token, a_client.owner, b"a:2"),
        None,
        fencelock.Leader(b.token, b_client.owner, b"b:1"),
    ]
    indexes = [c.index for c in told]
    assert indexes == sorted(indexes) and indexes[0] > 0
    assert observer.next(0.2) is None

    # A new observer starts with who leads now; iterating tells the same.
    late = watcher.observe(election)
    first = next(iter(late))
    assert first.leader == fencelock.Leader(b.token, b_client.owner, b"b:1")
    assert b.proclaim("b:2")
    assert late.next(5.0).leader.value == b"b:2"
    b.release()
    assert late.next(5.0).leader is None


def test_a_watch_starts_with_the_current_holders(cluster):
    client = cluster.client()
    prefix = _name("watch")
    held = [client.acquire(prefix + k, ttl=10, value="v-" + k) for k in ("a", "b")]
    outside = client.acquire(prefix[:-1] + "-other", ttl=10)
    watch = client.watch(prefix)
    assert watch.position is None
    batch = watch.next()  # at once, whatever the wait
    assert batch.events == [] and not batch.compacted and batch.index > 0
    assert watch.position == batch.index
    assert [(i.key, i.token, i.value) for i in batch.current] == [
        (prefix.encode() + b"a", held[0].token, b"v-a"),
        (prefix.encode() + b"b", held[1].token, b"v-b"),
    ]
    # Nothing changes: an empty answer after the wait, never going back.
    started = time.monotonic()
    quiet = watch.next(0.3)
    assert quiet.events == [] and quiet.current is None and quiet.index >= batch.index
    assert time.monotonic() - started >= 0.25
    # A change ends the long poll at once.
    threading.Timer(0.2, held[0].release).start()
    started = time.monotonic()
    woken = watch.next(10.0)
    assert time.monotonic() - started < 5.0
    assert [(e.key, e.kind, e.token) for e in woken.events] == [(prefix.encode() + b"a", "released", held[0].token)]
    assert woken.events[0].owner == client.owner and woken.events[0].value == b"v-a"
    assert woken.index == woken.events[-1].index > batch.index
    for lock in (held[1], outside):
        lock.release()


def test_a_watch_from_an_old_index_after_many_changes(cluster):
    client = cluster.client()
    prefix = _name("history")
    start = client.watch(prefix)
    start.next()
    position = start.position
    done = []
    for i in range(150):
        key = f"{prefix}{i % 3}"
        grant = client.acquire_raw(key, ttl=10, value=f"v{i}")
        done.append((key.encode(), "granted", grant.token, f"v{i}".encode()))
        if i % 2:
            assert client.proclaim(key, grant.token, f"p{i}")
            done.append((key.encode(), "proclaimed", grant.token, f"p{i}".encode()))
        assert client.release(key, grant.token)
        done.append((key.encode(), "released", grant.token, (f"p{i}" if i % 2 else f"v{i}").encode()))
    # From the old position, in pages of at most about 40 events.
    watch = client.watch(prefix, after=position)
    watch._limit = 40
    seen, pages = [], 0
    while len(seen) < len(done):
        batch = watch.next(2.0)
        assert not batch.compacted and batch.current is None
        assert batch.events, f"no more events after {len(seen)} of {len(done)}"
        seen += batch.events
        pages += 1
    assert [(e.key, e.kind, e.token, e.value) for e in seen] == done
    assert pages >= len(done) // 40
    indexes = [e.index for e in seen]
    assert indexes == sorted(indexes) and indexes[0] > position
    assert watch.position >= indexes[-1]


def test_a_watch_goes_on_across_a_leader_change_and_loses_no_event(new_cluster):
    cluster = new_cluster()
    leader = cluster.leader()
    # The watchers ask the leader first, so that the kill cuts their watches.
    others = [e for e in cluster.endpoints if e != leader.client_addr]
    watcher = fencelock.Client([leader.client_addr, *others], retry_for=15.0, request_timeout=1.0)
    cluster.clients.append(watcher)
    writer = cluster.client(request_timeout=1.0)
    prefix = "jobs/"
    # One watch follows as things happen (parked in a long poll on the
    # leader when it dies); the other is held back until after the kill,
    # and then asks another node for what it missed.
    live, behind = watcher.watch(prefix), watcher.watch(prefix)
    assert live.next().current == [] and behind.next().current == []
    assert watcher.preferred_endpoint == leader.client_addr
    done = []
    expected = 2 * 10 * 3
    killed = threading.Event()
    failures = []

    def follow(watch, seen, all_told, gate=None):
        try:
            if gate is not None:
                gate.wait(30)
            while len(seen) < expected:
                seen.extend(watch.next(0.5).events)
        except Exception as err:  # reported by the test below
            failures.append(err)
        all_told.set()

    live_seen, behind_seen = [], []
    live_done, behind_done = threading.Event(), threading.Event()
    threading.Thread(target=follow, args=(live, live_seen, live_done), daemon=True).start()
    threading.Thread(target=follow, args=(behind, behind_seen, behind_done, killed), daemon=True).start()

    def work(n: int, round_: str) -> None:
        for i in range(n):
            key = f"{prefix}{round_}{i % 2}"
            grant = writer.acquire_raw(key, ttl=10, value=f"{round_}{i}")
            done.append((key.encode(), "granted", grant.token))
            assert writer.proclaim(key, grant.token, f"{round_}{i}+")
            done.append((key.encode(), "proclaimed", grant.token))
            assert writer.release(key, grant.token)
            done.append((key.encode(), "released", grant.token))

    work(10, "before")
    time.sleep(0.2)  # the live watch catches up and waits on the leader
    leader.kill()
    killed.set()
    work(10, "after")
    assert live_done.wait(20) and behind_done.wait(20)
    assert not failures, failures
    for seen in (live_seen, behind_seen):
        assert [(e.key, e.kind, e.token) for e in seen] == done
        indexes = [e.index for e in seen]
        assert indexes == sorted(indexes) and len(set(indexes)) == len(indexes)
    assert live.position >= live_seen[-1].index and behind.position >= live_seen[-1].index
    # Another node answered after the kill.
    assert watcher.preferred_endpoint != leader.client_addr
