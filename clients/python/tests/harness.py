"""Real fencelockd clusters for the tests: ports, processes, logs.

The binary is ``$FENCELOCKD``, else ``target/debug/fencelockd`` of the
repository (``cargo build --bins`` makes it). Each node listens on ports
outside the kernel's ephemeral range, as crates/launch/src/ports.rs picks
them: a port bound at 0 and closed may be taken by an outgoing connection
before the node binds it. A node that still fails to bind (another program
took the port meanwhile) makes the cluster start again on other ports.
"""

import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional

import fencelock

REPO_ROOT = Path(__file__).resolve().parents[3]


def fencelockd_binary() -> Path:
    configured = os.environ.get("FENCELOCKD")
    path = Path(configured) if configured else REPO_ROOT / "target" / "debug" / "fencelockd"
    if not path.is_absolute():
        path = (Path.cwd() / path) if (Path.cwd() / path).exists() else REPO_ROOT / path
    return path


class _Ports:
    """Ports on 127.0.0.1 outside the ephemeral range, never handed out
    twice in this process, starting at a block chosen by the process id so
    that test processes running side by side start apart."""

    BLOCK = 128
    UNPRIVILEGED_MIN = 1024

    def __init__(self) -> None:
        low, high = 32768, 60999
        try:
            with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
                low, high = (int(n) for n in f.read().split())
        except (OSError, ValueError):
            pass
        below = (self.UNPRIVILEGED_MIN, max(0, low - self.UNPRIVILEGED_MIN))
        above = (high + 1, 65535 - high)
        self.first, self.length = below if below[1] >= above[1] else above
        if self.length < self.BLOCK:
            raise RuntimeError(f"no room for ports outside the ephemeral range {low}-{high}")
        self.start = os.getpid() % (self.length // self.BLOCK) * self.BLOCK
        self.handed_out = 0
        self.lock = threading.Lock()

    def take(self) -> int:
        with self.lock:
            while self.handed_out < self.length:
                port = self.first + (self.start + self.handed_out) % self.length
                self.handed_out += 1
                with socket.socket() as probe:
                    try:
                        probe.bind(("127.0.0.1", port))
                    except OSError:
                        continue
                return port
        raise RuntimeError("every port outside the ephemeral range was handed out")


PORTS = _Ports()


class Node:
    def __init__(self, cluster: "Cluster", node_id: int):
        self.cluster = cluster
        self.id = node_id
        self.peer_addr = ""
        self.client_addr = ""
        self.data_dir = cluster.dir / f"d{node_id}"
        self.log_path = cluster.dir / f"node-{node_id}.log"
        self.proc: Optional[subprocess.Popen] = None

    def start(self) -> None:
        args = [
            str(self.cluster.binary),
            "--id", str(self.id),
            "--peers", self.cluster.peers,
            "--client-addr", self.client_addr,
            "--data-dir", str(self.data_dir),
            *self.cluster.extra_args,
        ]
        with open(self.log_path, "ab") as log:
            log.write(f"$ {' '.join(args)}\n".encode())
            log.flush()
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.send_signal(sig)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.alive:
            assert self.proc is not None
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)

    def log_tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "(no log)"
        return "\n".join(text[-lines:])


class Cluster:
    """``size`` fencelockd nodes on 127.0.0.1, data in ``directory``."""

    def __init__(self, directory: Path, size: int = 3, extra_args: Optional[List[str]] = None,
                 client_options: Optional[dict] = None):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.binary = fencelockd_binary()
        if not os.access(self.binary, os.X_OK):
            raise RuntimeError(
                f"no fencelockd at {self.binary}: build it with `cargo build --bins`, or set FENCELOCKD")
        self.extra_args = list(extra_args or [])
        # For every client of the harness and the tests (tls=...).
        self.client_options = dict(client_options or {})
        self.nodes: Dict[int, Node] = {i: Node(self, i) for i in range(1, size + 1)}
        self.peers = ""
        self.clients: List[fencelock.Client] = []

    @property
    def endpoints(self) -> List[str]:
        return [node.client_addr for node in self.nodes.values()]

    def start(self, timeout: float = 30.0) -> "Cluster":
        for attempt in range(3):
            for node in self.nodes.values():
                node.peer_addr = f"127.0.0.1:{PORTS.take()}"
                node.client_addr = f"127.0.0.1:{PORTS.take()}"
                if attempt:
                    node.data_dir = self.dir / f"d{node.id}-retry{attempt}"
            self.peers = ",".join(f"{n.id}={n.peer_addr}" for n in self.nodes.values())
            for node in self.nodes.values():
                node.start()
            try:
                self.wait_ready(timeout)
                return self
            except _NodeDied:
                # Most likely a port taken between the check and the bind.
                self.stop()
                if attempt == 2:
                    raise
        return self

    def client(self, **options) -> fencelock.Client:
        """A client of this cluster, closed when the cluster stops."""
        options = {"retry_for": 15.0, **self.client_options, **options}
        client = fencelock.Client(self.endpoints, **options)
        self.clients.append(client)
        return client

    def wait_ready(self, timeout: float) -> None:
        """Until a leader with a quorum answers a linearizable read."""
        deadline = time.monotonic() + timeout
        probe = fencelock.Client(self.endpoints, **{**self.client_options, "request_timeout": 1.0, "retry_for": 1.0})
        try:
            last = None
            while time.monotonic() < deadline:
                for node in self.nodes.values():
                    if node.proc is not None and not node.alive:
                        raise _NodeDied(f"node {node.id} exited at start:\n{node.log_tail()}")
                try:
                    probe.list("", 1)
                    return
                except fencelock.FencelockError as err:
                    last = err
                time.sleep(0.1)
            raise RuntimeError(f"the cluster did not become ready within {timeout} s ({last})\n{self.log_tails()}")
        finally:
            probe.close()

    def statuses(self) -> Dict[int, fencelock.NodeStatus]:
        """The status of every live node that answers."""
        probe = fencelock.Client(self.endpoints, **{**self.client_options, "request_timeout": 1.0, "retry_for": 0})
        try:
            found = {}
            for node in self.nodes.values():
                if node.alive:
                    try:
                        found[node.id] = probe.status(node.client_addr)
                    except fencelock.FencelockError:
                        pass
            return found
        finally:
            probe.close()

    def leader(self, timeout: float = 15.0, exclude: Optional[int] = None) -> Node:
        """The node that leads with a quorum, once one does."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node_id, status in self.statuses().items():
                if status.is_leader and status.quorum and node_id != exclude:
                    return self.nodes[node_id]
            time.sleep(0.1)
        raise AssertionError(f"no leader within {timeout} s\n{self.log_tails()}")

    def stop(self) -> None:
        for client in self.clients:
            client.close()
        self.clients.clear()
        for node in self.nodes.values():
            node.stop()

    def log_tails(self, lines: int = 30) -> str:
        return "\n".join(f"--- node {n.id} ({n.log_path}) ---\n{n.log_tail(lines)}" for n in self.nodes.values())


class _NodeDied(RuntimeError):
    pass


def wait_until(condition, timeout: float, interval: float = 0.05) -> bool:
    """Polls ``condition`` until it is true (True) or ``timeout`` passes
    (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if condition():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval)


def read_frame(sock: socket.socket) -> Optional[bytes]:
    """One frame's body from a blocking socket; None at the end of stream."""
    header = _read_exactly(sock, 4)
    if header is None:
        return None
    body = _read_exactly(sock, int.from_bytes(header, "big"))
    return body


def _read_exactly(sock: socket.socket, size: int) -> Optional[bytes]:
    data = bytearray()
    while len(data) < size:
        try:
            chunk = sock.recv(size - len(data))
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return bytes(data)


def frame(message) -> bytes:
    body = message.SerializeToString()
    return len(body).to_bytes(4, "big") + body


#: ``(CONNECTION_LEVEL, response)`` from a FakeNode's handler: an answer of
#: id 0, about the connection itself.
CONNECTION_LEVEL = object()


class FakeNode:
    """A scripted node on 127.0.0.1: ``handler(request)`` returns the
    Response to send (its id is set here), a ``(delay, Response)`` pair to
    answer later, ``(CONNECTION_LEVEL, Response)`` to answer with id 0, or
    None to close the connection. Each request is handled
    on a thread of its own, so that answers can overtake each other."""

    def __init__(self, handler, tls=None):
        self.handler = handler
        #: A server ssl.SSLContext to speak TLS with, else plain TCP.
        self.tls = tls
        self.requests: List = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self.listener.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            if self.tls is not None:
                try:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                except OSError:
                    conn.close()
                    continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        from fencelock import client_pb2 as pb

        write = threading.Lock()
        with conn:
            while True:
                body = read_frame(conn)
                if body is None:
                    return
                request = pb.Request.FromString(body)
                self.requests.append(request)
                threading.Thread(target=self._answer, args=(conn, write, request), daemon=True).start()

    def _answer(self, conn: socket.socket, write: threading.Lock, request) -> None:
        answer = self.handler(request)
        if answer is None:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return
        delay, response = answer if isinstance(answer, tuple) else (0.0, answer)
        if delay is CONNECTION_LEVEL:
            response.id = 0
        else:
            time.sleep(delay)
            response.id = request.id
        with write:
            try:
                conn.sendall(frame(response))
            except OSError:
                pass

    def close(self) -> None:
        self.listener.close()


class DroppingProxy:
    """Forwards client connections to ``upstream``, but swallows the first
    acquire answer and closes that connection instead: an answer lost on
    the way, as after a network fault. ``dropped`` is the lost answer."""

    def __init__(self, upstream: str):
        self.upstream = upstream
        self.dropped = None
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.addr = "127.0.0.1:%d" % self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            host, port = self.upstream.rsplit(":", 1)
            server = socket.create_connection((host, int(port)))
            threading.Thread(target=self._up, args=(client, server), daemon=True).start()
            threading.Thread(target=self._down, args=(client, server), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket) -> None:
        while True:
            try:
                data = client.recv(65536)
                if not data:
                    break
                server.sendall(data)
            except OSError:
                break
        _close(client, server)

    def _down(self, client: socket.socket, server: socket.socket) -> None:
        from fencelock import client_pb2 as pb

        while True:
            body = read_frame(server)
            if body is None:
                break
            response = pb.Response.FromString(body)
            if self.dropped is None and response.WhichOneof("kind") == "acquire":
                self.dropped = response
                break
            try:
                client.sendall(len(body).to_bytes(4, "big") + body)
            except OSError:
                break
        _close(client, server)

    def close(self) -> None:
        self.listener.close()


def _close(*socks: socket.socket) -> None:
    for sock in socks:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        sock.close()
