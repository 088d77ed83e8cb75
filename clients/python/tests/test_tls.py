"""TLS: a one-node cluster started with --certs-dir, certificates made by
the `fencelock` CLI (beside fencelockd)."""

import ssl
import subprocess
import time

import pytest

import fencelock
from fencelock import client_pb2 as pb
from harness import FakeNode, fencelockd_binary


@pytest.fixture
def certs(tmp_path):
    cli = fencelockd_binary().parent / "fencelock"
    if not cli.exists():
        pytest.skip(f"no fencelock CLI at {cli} to make certificates (cargo build --bins)")
    directory = tmp_path / "certs"
    for args in (["create-ca"], ["create-node", "--id", "1", "127.0.0.1"],
                 ["create-client", "alice"], ["create-client", "bob"]):
        subprocess.run([str(cli), "cert", "--certs-dir", str(directory), *args],
                       check=True, capture_output=True)
    return directory


def _tls(certs, user):
    return (str(certs / "ca.crt"), str(certs / f"client-{user}.crt"), str(certs / f"client-{user}.key"))


def test_a_client_speaks_tls_with_a_certificate_of_the_cluster(new_cluster, certs):
    cluster = new_cluster(1, ["--certs-dir", str(certs)], {"tls": _tls(certs, "alice")})
    alice = cluster.client()
    # The owner belongs to the certificate's user: alice/...
    assert alice.owner.startswith(b"alice/")
    with alice.lock("tls/k", ttl=3) as lock:
        assert alice.check("tls/k", lock.token)
        assert alice.get("tls/k").owner == alice.owner
        bob = cluster.client(tls=_tls(certs, "bob"))
        # Bob may not release or renew alice's lock, even with its token.
        with pytest.raises(fencelock.PermissionDenied):
            bob.release("tls/k", lock.token)
        # Nor act as one of alice's owners.
        with pytest.raises(fencelock.PermissionDenied):
            cluster.client(tls=_tls(certs, "bob"), owner="alice/x").acquire("tls/other", ttl=3)
        time.sleep(1.5)  # renewals go over TLS too
        assert not lock.is_lost() and lock.renewals >= 1
    # A plain client is refused at once, not after retry_for.
    plain = fencelock.Client(cluster.endpoints, retry_for=10)
    started = time.monotonic()
    with pytest.raises(fencelock.InvalidArgument, match="TLS"):
        plain.get("tls/k")
    assert time.monotonic() - started < 2.0


def _node_context(certs, node_id):
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(str(certs / f"node-{node_id}.crt"), str(certs / f"node-{node_id}.key"))
    return context


def test_a_redirect_is_followed_only_to_the_node_it_named(certs):
    cli = fencelockd_binary().parent / "fencelock"
    for node_id in (2, 3):
        subprocess.run([str(cli), "cert", "--certs-dir", str(certs), "create-node", "--id", str(node_id),
                        "127.0.0.1"], check=True, capture_output=True)
    found = pb.Response(check=pb.CheckResponse(holds=True))

    def redirect_to(leader_id, addr):
        error = pb.Error(code=pb.NOT_LEADER, message="not the leader", leader_id=leader_id, leader_addr=addr)
        return lambda request: pb.Response(error=error)

    # Node 3's certificate where node 1 says node 2 leads: never asked.
    impostor = FakeNode(lambda request: found, tls=_node_context(certs, 3))
    follower = FakeNode(redirect_to(2, impostor.addr), tls=_node_context(certs, 1))
    client = fencelock.Client([follower.addr], tls=_tls(certs, "alice"), retry_for=0.5)
    with pytest.raises(fencelock.Unavailable):
        client.check("k", 1)
    assert impostor.requests == []
    # Node 2's certificate there: followed.
    leader = FakeNode(lambda request: found, tls=_node_context(certs, 2))
    follower = FakeNode(redirect_to(2, leader.addr), tls=_node_context(certs, 1))
    client = fencelock.Client([follower.addr], tls=_tls(certs, "alice"), retry_for=5)
    assert client.check("k", 1)
    assert len(leader.requests) >= 1
