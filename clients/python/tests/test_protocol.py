"""The wire protocol and the retry rules, against scripted fake nodes."""

import threading
import time

import pytest

import fencelock
import fencelock.client
from fencelock import client_pb2 as pb
from harness import CONNECTION_LEVEL, FakeNode, wait_until


def _check_answer(holds: bool = True) -> pb.Response:
    return pb.Response(check=pb.CheckResponse(holds=holds))


def _error(code: int, message: str = "", leader_addr: str = "") -> pb.Response:
    return pb.Response(error=pb.Error(code=code, message=message, leader_addr=leader_addr))


@pytest.fixture
def sleeps(monkeypatch):
    """Records the client's backoff pauses (and still pauses)."""
    recorded = []
    real_sleep = time.sleep

    class Clock:
        monotonic = staticmethod(time.monotonic)

        @staticmethod
        def sleep(seconds):
            recorded.append(seconds)
            real_sleep(seconds)

    monkeypatch.setattr(fencelock.client, "time", Clock)
    return recorded


def test_frames_and_pipelined_answers_out_of_order():
    # The first request is answered last: answers are matched by id.
    def handler(request):
        key = request.check.key
        return (0.3 if key == b"slow" else 0.0), _check_answer(key == b"slow")

    node = FakeNode(handler)
    client = fencelock.Client([node.addr])
    results = {}
    slow = threading.Thread(target=lambda: results.__setitem__("slow", client.check("slow", 1)))
    slow.start()
    time.sleep(0.05)
    started = time.monotonic()
    assert client.check("fast", 1) is False
    assert time.monotonic() - started < 0.25, "the fast answer waited for the slow one"
    slow.join(5)
    assert results == {"slow": True}
    # One connection, two requests in flight on it, with distinct non-zero ids.
    assert node.connections == 1
    ids = [r.id for r in node.requests]
    assert len(set(ids)) == 2 and 0 not in ids
    assert node.requests[0].check.token == 1
    client.close()
    node.close()


def test_the_first_redirect_is_followed_at_once_and_a_chain_backs_off(sleeps):
    leader = FakeNode(lambda request: _check_answer())
    stale = FakeNode(lambda request: _error(pb.NOT_LEADER, "not the leader", leader.addr))
    follower = FakeNode(lambda request: _error(pb.NOT_LEADER, "not the leader", stale.addr))
    client = fencelock.Client([follower.addr])
    assert client.check("k", 7) is True
    # follower -> stale (at once) -> leader (after a backoff)
    assert len(sleeps) == 1 and 0.010 <= sleeps[0] <= 0.020, sleeps
    assert client.preferred_endpoint == leader.addr
    sleeps.clear()
    assert client.check("k", 7) is True
    assert sleeps == [] and len(leader.requests) == 2
    for node in (leader, stale, follower):
        node.close()


def test_unavailable_nodes_are_retried_with_growing_jittered_backoff(sleeps):
    answers = []

    def busy(request):
        answers.append(request)
        return _error(pb.UNAVAILABLE, "no leader yet")

    node = FakeNode(busy)
    client = fencelock.Client([node.addr], retry_for=2.5)
    with pytest.raises(fencelock.Unavailable) as unavailable:
        client.check("k", 1)
    assert "no leader yet" in str(unavailable.value)
    pauses = sleeps[:-1]  # the last one is cut short by the deadline
    assert len(pauses) >= 6
    nominal = [min(0.020 * 2**i, 0.500) for i in range(len(pauses))]
    for pause, cap in zip(pauses, nominal):
        assert cap / 2 <= pause <= cap, (pauses, nominal)
    assert len(set(pauses)) == len(pauses), "no jitter"
    assert max(pauses) > 0.25, pauses
    assert len(answers) == len(sleeps)
    node.close()


def test_timeouts_closed_connections_and_refusals_move_on_to_the_next_endpoint(sleeps):
    good = FakeNode(lambda request: _check_answer())
    silent = FakeNode(lambda request: (10.0, _check_answer(False)))
    closing = FakeNode(lambda request: None)
    refusing = FakeNode(lambda request: _error(pb.UNAVAILABLE, "overloaded"))
    client = fencelock.Client([silent.addr, closing.addr, refusing.addr, good.addr], request_timeout=0.3)
    started = time.monotonic()
    assert client.check("k", 1) is True
    assert time.monotonic() - started < 2.0
    assert [len(n.requests) for n in (silent, closing, refusing, good)] == [1, 1, 1, 1]
    assert client.preferred_endpoint == good.addr
    for node in (good, silent, closing, refusing):
        node.close()


def test_a_connection_refusal_of_id_0_fails_the_call_on_it():
    # id 0: about the connection itself; it fails what is in flight on it.
    def refuse(request):
        return CONNECTION_LEVEL, _error(pb.UNAVAILABLE, "too many connections")

    refusing = FakeNode(refuse)
    good = FakeNode(lambda request: _check_answer())
    client = fencelock.Client([refusing.addr, good.addr])
    started = time.monotonic()
    assert client.check("k", 1) is True
    assert time.monotonic() - started < 1.0, "the refusal was not taken for the call's answer"
    assert len(refusing.requests) == 1 and len(good.requests) == 1
    refusing.close()
    good.close()


def test_errors_that_retrying_cannot_fix_are_raised_at_once():
    for code, error in [
        (pb.INVALID_ARGUMENT, fencelock.InvalidArgument),
        (pb.PERMISSION_DENIED, fencelock.PermissionDenied),
        (pb.RESOURCE_EXHAUSTED, fencelock.ResourceExhausted),
        (pb.INTERNAL, fencelock.Internal),
    ]:
        node = FakeNode(lambda request, code=code: _error(code, "told so"))
        backup = FakeNode(lambda request: _check_answer())
        client = fencelock.Client([node.addr, backup.addr])
        with pytest.raises(error, match="told so"):
            client.check("k", 1)
        assert backup.requests == []
        node.close()
        backup.close()


def test_an_acquire_carries_its_owner_lease_and_wait_and_reads_the_outcome():
    outcomes = iter([
        pb.AcquireResponse(outcome=pb.GRANTED, token=41, lease_ms=3000, existing=True),
        pb.AcquireResponse(outcome=pb.HELD, holder_token=40),
        pb.AcquireResponse(outcome=pb.WAIT_TIMED_OUT),
    ])
    node = FakeNode(lambda request: pb.Response(acquire=next(outcomes)))
    client = fencelock.Client([node.addr], owner=b"me/1")
    grant = client.acquire_raw("k", ttl=2.5, wait=1.5)
    assert (grant.token, grant.ttl, grant.existing) == (41, 3.0, True)
    sent = node.requests[0].acquire
    assert (sent.key, sent.owner, sent.lease_ms) == (b"k", b"me/1", 2500)
    assert 1000 < sent.wait_ms <= 1500
    with pytest.raises(fencelock.Held) as held:
        client.acquire_raw("k", ttl=2.5)
    assert held.value.holder_token == 40
    with pytest.raises(fencelock.WaitTimedOut) as timed_out:
        client.acquire_raw("k", ttl=2.5)
    assert timed_out.value.holder_token is None
    node.close()


def test_a_plain_client_against_a_tls_port_says_so():
    # What a TLS node sends a plain client: an alert record, read as a
    # frame header it is a length of about 350 MB.
    import socket

    listener = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = listener.accept()
        conn.recv(100)
        conn.sendall(bytes([0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x32]))
        conn.close()

    threading.Thread(target=serve, daemon=True).start()
    client = fencelock.Client(["127.0.0.1:%d" % listener.getsockname()[1]], retry_for=5)
    started = time.monotonic()
    with pytest.raises(fencelock.InvalidArgument, match="speaks TLS"):
        client.check("k", 1)
    assert time.monotonic() - started < 1.0, "a refusal was retried until retry_for"
    listener.close()


def test_a_lease_counts_from_when_the_request_was_sent_less_the_drift_margin():
    # The grant comes back 0.5 s after the acquire was sent: those 0.5 s are
    # already gone from the lease, and the margin for clock drift too.
    def handler(request):
        kind = request.WhichOneof("kind")
        if kind == "acquire":
            return 0.5, pb.Response(acquire=pb.AcquireResponse(outcome=pb.GRANTED, token=9, lease_ms=4000))
        if kind == "renew":
            results = [pb.RenewResult(key=ref.key, token=ref.token, renewed=True) for ref in request.renew.locks]
            return pb.Response(renew=pb.RenewResponse(results=results, lease_ms=request.renew.lease_ms))
        return pb.Response(release=pb.ReleaseResponse(released=True))

    node = FakeNode(handler)
    client = fencelock.Client([node.addr], drift=0.05)
    lock = client.acquire("k", ttl=4)
    safe = 4 * 0.95 / 1.05
    assert safe - 0.6 < lock.time_left() <= safe - 0.5
    # Renewed a third of the ttl after the acquire was sent: the lease then
    # counts from that renewal's sending.
    assert node.requests[-1].WhichOneof("kind") == "acquire"
    time.sleep(4 / 3 - 0.5 + 0.3)
    assert [r.WhichOneof("kind") for r in node.requests] == ["acquire", "renew"]
    assert node.requests[1].renew.lease_ms == 4000
    # (without the renewal, about safe - 1.6 would be left)
    assert lock.renewals == 1 and safe - 1.0 < lock.time_left() <= safe
    assert lock.release() is True
    assert node.requests[-1].WhichOneof("kind") == "release"
    client.close()
    node.close()


def test_a_watch_starts_at_once_then_long_polls_from_its_position():
    answers = iter([
        pb.WatchResponse(index=10, has_current=True, current=[
            pb.LockInfo(key=b"e/a", token=3, owner=b"o", lease_ms=5000, value=b"v")]),
        pb.WatchResponse(index=15, events=[
            pb.WatchEvent(index=12, key=b"e/a", kind=6, token=3, owner=b"o", value=b"w"),
            pb.WatchEvent(index=15, key=b"e/b", kind=9, token=4, owner=b"p"),
        ]),
        pb.WatchResponse(index=15),
        pb.WatchResponse(index=14),  # going back: a node's bug
    ])
    node = FakeNode(lambda request: pb.Response(watch=next(answers)))
    client = fencelock.Client([node.addr])
    watch = client.watch("e/")
    first = watch.next(wait=5.0)
    assert first.current == [fencelock.LockInfo(b"e/a", 3, b"o", 5.0, 0.0, False, b"v")]
    assert (first.events, first.index, first.compacted, watch.position) == ([], 10, False, 10)
    second = watch.next(wait=2.0)
    assert second.current is None and watch.position == 15
    assert second.events == [
        fencelock.WatchEvent(12, b"e/a", "proclaimed", 3, b"o", b"w"),
        fencelock.WatchEvent(15, b"e/b", "unknown", 4, b"p", b""),
    ]
    assert watch.next(wait=0).events == []
    with pytest.raises(fencelock.Internal, match="index 14"):
        watch.next(wait=0)
    sent = [r.watch for r in node.requests]
    assert (sent[0].prefix, sent[0].start, sent[0].wait_ms) == (b"e/", True, 0)
    assert (sent[1].start, sent[1].after_index) == (False, 10) and 1900 <= sent[1].wait_ms <= 2000
    assert (sent[2].after_index, sent[2].wait_ms) == (15, 0)
    # A watch resumed from a position asks from it at once.
    resumed = client.watch(b"e/", after=7)
    assert resumed.position == 7
    client.close()
    node.close()


def test_a_watch_is_answered_by_any_node_and_waits_on_top_of_the_request_timeout():
    closing = FakeNode(lambda request: None)
    slow = FakeNode(lambda request: (0.6, pb.Response(watch=pb.WatchResponse(index=request.watch.after_index + 1))))
    client = fencelock.Client([closing.addr, slow.addr], request_timeout=0.3)
    watch = client.watch("p", after=4)
    # 0.6 s of waiting on the node: more than the request timeout, within
    # the wait on top of it.
    assert watch.next(wait=0.5).index == 5
    assert len(closing.requests) == 1 and len(slow.requests) == 1
    assert client.preferred_endpoint == slow.addr
    client.close()
    closing.close()
    slow.close()


def test_an_observer_tells_each_new_leader_and_value_of_its_key_once():
    from fencelock.watch import ObserverState

    def event(index, key, kind, token, value):
        return fencelock.WatchEvent(index, key, kind, token, b"o", value)

    def info(token, value, delayed=False):
        return fencelock.LockInfo(b"e", token, b"o", 1.0, 0.0, delayed, value)

    state = ObserverState(b"e")
    state.take(fencelock.WatchBatch([], 10, [info(3, b"a")], False))
    state.take(fencelock.WatchBatch([
        event(11, b"e2", "granted", 4, b"x"),  # another key under the prefix
        event(12, b"e", "proclaimed", 3, b"b"),
        event(13, b"e", "expired", 3, b"b"),
        event(14, b"e", "delay_lifted", 3, b"b"),
        event(15, b"e", "granted", 5, b"c"),
        event(16, b"e", "unknown", 5, b"d"),
    ], 16, None, False))
    told = list(iter(state.pop, None))
    leader = lambda token, value: fencelock.Leader(token, b"o", value)  # noqa: E731
    assert told == [
        fencelock.LeaderChange(leader(3, b"a"), 10),
        fencelock.LeaderChange(leader(3, b"b"), 12),
        fencelock.LeaderChange(None, 13),
        fencelock.LeaderChange(leader(5, b"c"), 15),
    ]
    # A compacted answer that says what was told already adds nothing; a
    # key held back by lock-delay has no leader.
    state.take(fencelock.WatchBatch([], 20, [info(5, b"c")], True))
    assert state.pop() is None
    state.take(fencelock.WatchBatch([], 30, [info(5, b"c", delayed=True)], True))
    assert state.pop() == fencelock.LeaderChange(None, 30)


def test_a_campaign_without_a_wait_asks_again_until_it_leads(monkeypatch):
    monkeypatch.setattr(fencelock.client, "CAMPAIGN_ROUND", 0.2)
    outcomes = iter([pb.WAIT_TIMED_OUT, pb.WAIT_TIMED_OUT, pb.GRANTED])

    def handler(request):
        kind = request.WhichOneof("kind")
        if kind == "acquire":
            outcome = next(outcomes)
            token = 8 if outcome == pb.GRANTED else 0
            return pb.Response(acquire=pb.AcquireResponse(outcome=outcome, token=token, holder_token=7,
                                                          lease_ms=request.acquire.lease_ms))
        if kind == "proclaim":
            return pb.Response(proclaim=pb.ProclaimResponse(proclaimed=True, token=8))
        return pb.Response(release=pb.ReleaseResponse(released=True))

    node = FakeNode(handler)
    client = fencelock.Client([node.addr], owner="me")
    with client.campaign("election", "10.0.0.1:80", ttl=30) as lock:
        assert lock.token == 8 and not lock.is_lost()
        assert lock.proclaim(b"10.0.0.2:80") is True
    acquires = [r.acquire for r in node.requests if r.WhichOneof("kind") == "acquire"]
    assert len(acquires) == 3
    assert {(a.key, a.owner, a.value) for a in acquires} == {(b"election", b"me", b"10.0.0.1:80")}
    assert all(0 < a.wait_ms <= 200 for a in acquires)
    proclaim = [r.proclaim for r in node.requests if r.WhichOneof("kind") == "proclaim"][0]
    assert (proclaim.key, proclaim.token, proclaim.value) == (b"election", 8, b"10.0.0.2:80")
    assert node.requests[-1].WhichOneof("kind") == "release"
    client.close()
    node.close()


def test_a_grant_after_a_long_wait_is_renewed_before_it_is_handed_over():
    # Granted 0.7 s after the acquire was sent, of a 1 s lease: all the
    # client can prove is the send time, so it renews at once.
    def handler(request):
        kind = request.WhichOneof("kind")
        if kind == "acquire":
            return 0.7, pb.Response(acquire=pb.AcquireResponse(outcome=pb.GRANTED, token=9, lease_ms=1000))
        if kind == "renew":
            results = [pb.RenewResult(key=ref.key, token=ref.token, renewed=True) for ref in request.renew.locks]
            return pb.Response(renew=pb.RenewResponse(results=results, lease_ms=request.renew.lease_ms))
        return pb.Response(release=pb.ReleaseResponse(released=True))

    node = FakeNode(handler)
    client = fencelock.Client([node.addr], drift=0.0)
    lock = client.acquire("k", ttl=1, wait=5)
    assert [r.WhichOneof("kind") for r in node.requests] == ["acquire", "renew"]
    assert lock.time_left() > 0.8
    lock.release()
    client.close()
    node.close()


def _lock_node(token: int = 9):
    """A node that grants every acquire under ``token`` and renews and
    releases whatever it is asked to."""
    def handler(request):
        kind = request.WhichOneof("kind")
        if kind == "acquire":
            return pb.Response(acquire=pb.AcquireResponse(outcome=pb.GRANTED, token=token,
                                                          lease_ms=request.acquire.lease_ms))
        if kind == "renew":
            results = [pb.RenewResult(key=ref.key, token=ref.token, renewed=True) for ref in request.renew.locks]
            return pb.Response(renew=pb.RenewResponse(results=results, lease_ms=request.renew.lease_ms))
        return pb.Response(release=pb.ReleaseResponse(released=True, token=request.release.token))

    return FakeNode(handler)


def test_a_shared_acquire_carries_its_share_and_permits_and_a_plain_one_does_not():
    node = _lock_node()
    client = fencelock.Client([node.addr], owner=b"me")
    Share = fencelock.Share
    client.acquire_shared_raw("rw", Share.READ, ttl=5)
    client.acquire_shared_raw("rw", Share.WRITE, ttl=5, wait=1.5, owner="me/2")
    client.acquire_shared_raw(b"sem", Share.permit(100_000), ttl=5)
    client.acquire_raw("plain", ttl=5)
    sent = [r.acquire for r in node.requests]
    assert [(a.key, a.owner, a.share, a.permits, a.value) for a in sent] == [
        (b"rw", b"me", pb.READ, 0, b""),
        (b"rw", b"me/2", pb.WRITE, 0, b""),
        (b"sem", b"me", pb.PERMIT, 100_000, b""),
        (b"plain", b"me", pb.EXCLUSIVE, 0, b""),
    ]
    assert 1000 < sent[1].wait_ms <= 1500 and sent[0].wait_ms == 0
    # A plain acquire is on the wire what it was before the fields existed.
    plain = pb.AcquireRequest(key=b"plain", lease_ms=5000, owner=b"me")
    assert sent[3].SerializeToString() == plain.SerializeToString()

    # A shared Lock is renewed and released by its own token, in a with
    # block; under another owner, a process may hold a second permit.
    with client.lock_shared("sem", Share.permit(3), ttl=0.6, owner="me/2") as lock:
        assert (lock.token, lock.share) == (9, Share.permit(3)) and "Share.permit(3)" in repr(lock)
        acquire = node.requests[-1].acquire
        assert (acquire.owner, acquire.share, acquire.permits) == (b"me/2", pb.PERMIT, 3)
        assert wait_until(lambda: lock.renewals >= 1, 3.0)
    kinds = [r.WhichOneof("kind") for r in node.requests[4:]]
    assert kinds[0] == "acquire" and "renew" in kinds and kinds[-1] == "release"
    renew = next(r.renew for r in node.requests[4:] if r.WhichOneof("kind") == "renew")
    assert [(ref.key, ref.token) for ref in renew.locks] == [(b"sem", 9)]
    assert node.requests[-1].release.token == 9
    client.close()
    node.close()


def test_a_bad_share_is_refused_before_anything_is_sent():
    node = _lock_node()
    client = fencelock.Client([node.addr])
    Share = fencelock.Share
    for permits in (0, -1, 100_001):
        with pytest.raises(fencelock.InvalidArgument, match="1 to 100,000 permits"):
            Share.permit(permits)
    with pytest.raises(TypeError, match="permits is an int"):
        Share.permit(2.0)
    with pytest.raises(TypeError, match="permits is an int"):
        Share.permit(True)
    with pytest.raises(fencelock.InvalidArgument, match="not 'exclusive'"):
        Share("exclusive")
    with pytest.raises(fencelock.InvalidArgument, match="no permits"):
        Share("read", 2)
    for call in (client.acquire_shared, client.acquire_shared_raw, client.lock_shared):
        for share in ("read", pb.READ, None):
            with pytest.raises(TypeError, match=r"Share.READ, Share.WRITE or Share.permit\(n\)"):
                call("k", share, 5)
    assert node.requests == []
    # The bounds themselves are fine.
    assert (Share.permit(1).permits, Share.permit(100_000).permits) == (1, 100_000)
    client.close()
    node.close()


def test_a_share_of_another_kind_is_invalid_argument_and_leaves_nothing_held():
    message = "key k is a semaphore of 2 permits: acquire it with PERMIT and permits 2"
    refusing = FakeNode(lambda request: _error(pb.INVALID_ARGUMENT, message))
    backup = _lock_node()
    client = fencelock.Client([refusing.addr, backup.addr], owner="me")
    with pytest.raises(fencelock.InvalidArgument, match="semaphore of 2 permits"):
        client.acquire_shared("k", fencelock.Share.permit(3), ttl=5)
    assert backup.requests == [], "an INVALID_ARGUMENT was retried elsewhere"
    assert refusing.requests[0].acquire.permits == 3
    # The refused acquire did not keep the key held in this process: a new
    # one goes out at once (to the node that answers now).
    refusing.handler = lambda request: _error(pb.UNAVAILABLE, "gone")
    with client.lock_shared("k", fencelock.Share.permit(2), ttl=5) as lock:
        assert lock.token == 9
    client.close()
    refusing.close()
    backup.close()


def test_get_holders_and_list_read_every_holder_and_its_share():
    def info(token, share, permits=0):
        return pb.LockInfo(key=b"k", token=token, owner=b"o%d" % token, lease_ms=5000, share=share,
                           permits=permits)

    readers = [info(4, pb.READ), info(6, pb.READ)]
    answers = {
        b"rw": pb.GetResponse(holder=readers[0], holders=readers),
        b"plain": pb.GetResponse(holder=info(3, pb.EXCLUSIVE)),
        b"free": pb.GetResponse(),
        b"new": pb.GetResponse(holder=info(8, 9), holders=[info(8, 9)]),
    }

    def handler(request):
        if request.WhichOneof("kind") == "get":
            return pb.Response(get=answers[request.get.key])
        return pb.Response(list=pb.ListResponse(locks=[info(10, pb.PERMIT, 2), info(11, pb.PERMIT, 2)]))

    node = FakeNode(handler)
    client = fencelock.Client([node.addr])
    assert [(h.token, h.share, h.permits) for h in client.holders("rw")] == [(4, "read", 0), (6, "read", 0)]
    assert client.get("rw") == fencelock.LockInfo(b"k", 4, b"o4", 5.0, 0.0, False, b"", "read", 0)
    assert [(h.token, h.share) for h in client.holders("plain")] == [(3, "exclusive")]
    assert client.holders("free") == [] and client.get("free") is None
    assert [h.share for h in client.holders("new", linearizable=False)] == ["unknown"]
    assert [(i.token, i.share, i.permits) for i in client.list("k")] == [(10, "permit", 2), (11, "permit", 2)]
    gets = [r.get for r in node.requests if r.WhichOneof("kind") == "get"]
    assert [g.linearizable for g in gets] == [True, True, True, True, True, False]
    client.close()
    node.close()
