"""One pipelined connection to one node (docs/protocol.md, "Framing").

Frames are a 4-byte big-endian length, then one protobuf message: `Request`
from the client, `Response` from the server. Many requests are in flight at
once on one connection, each under its own id, and their answers come back
in any order. A reader thread per connection reads every frame and hands
each response to the caller waiting on its id. When the connection fails
(end of stream, an I/O error, a frame that does not decode, or a response of
id 0, which concerns the connection itself) every caller waiting on it is
told at once, and the connection is closed for good: the client opens a new
one on next use.

The socket is non-blocking and every read or write takes one lock, so that a
TLS session is never used by two threads at once.
"""

import itertools
import selectors
import socket
import ssl
import struct
import threading
import time
from typing import Dict, Optional, Tuple

from . import client_pb2 as pb

#: The largest response frame accepted: a list of many long keys is the
#: largest answer a server gives; anything bigger is a broken stream, or a
#: TLS record read as a frame.
FRAME_BYTES_MAX = 16 << 20

_HEADER = struct.Struct(">I")


class Closed(Exception):
    """The connection failed or was closed; the message says how.
    ``refused``: the node will not talk to this client as it is configured
    (TLS against plain TCP or the other way round, a certificate refused),
    so waiting will not help."""

    def __init__(self, reason: str, refused: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.refused = refused


class TimedOut(Exception):
    """No answer within the attempt's timeout; the connection stays up."""


def split_endpoint(endpoint: str) -> Tuple[str, int]:
    """``host:port`` or ``[v6]:port`` into its host and port."""
    host, sep, port = endpoint.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"endpoint {endpoint!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class _Slot:
    """Where the reader leaves one request's answer."""

    __slots__ = ("event", "response", "error")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.response: Optional[pb.Response] = None
        self.error: Optional[Closed] = None


class Connection:
    """A connection to the node at ``endpoint``, shared by every caller that
    uses that node."""

    def __init__(self, endpoint: str, timeout: float, tls: Optional[ssl.SSLContext] = None):
        self.endpoint = endpoint
        host, port = split_endpoint(endpoint)
        try:
            sock = socket.create_connection((host, port), timeout=max(timeout, 0.001))
        except OSError as err:
            raise Closed(f"cannot connect: {err}") from None
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if tls is not None:
                try:
                    sock = tls.wrap_socket(sock, server_hostname=host)
                except ssl.SSLError as err:
                    raise Closed(f"TLS handshake failed: {err}", refused=True) from None
                except OSError as err:
                    # A plain node closes the connection on our ClientHello.
                    raise Closed(f"TLS handshake failed: {err} (does the node speak TLS?)", refused=True) from None
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self._tls = tls is not None
        #: The node id the node's certificate names (TLS), else None.
        self.node: Optional[int] = _node_named(sock) if tls is not None else None
        self._io = threading.Lock()
        self._state = threading.Lock()
        self._pending: Dict[int, _Slot] = {}
        self._closed: Optional[Closed] = None
        self._ids = itertools.count(1)
        self._reader = threading.Thread(target=self._read_loop, name=f"fencelock-reader-{endpoint}", daemon=True)
        self._reader.start()

    @property
    def closed(self) -> bool:
        return self._closed is not None

    def call(self, request: pb.Request, timeout: float) -> pb.Response:
        """Sends ``request`` under a fresh id and waits up to ``timeout`` for
        its answer. Raises :class:`Closed` or :class:`TimedOut`."""
        deadline = time.monotonic() + timeout
        slot = _Slot()
        with self._state:
            if self._closed is not None:
                raise self._closed
            request_id = next(self._ids)
            self._pending[request_id] = slot
        request.id = request_id
        body = request.SerializeToString()
        try:
            self._send(_HEADER.pack(len(body)) + body, deadline)
        except Closed as err:
            self.close(err.reason)
            raise (self._closed or err) from None
        if not slot.event.wait(max(0.0, deadline - time.monotonic())):
            with self._state:
                self._pending.pop(request_id, None)
            # The answer may have come in the meantime.
            if not slot.event.is_set():
                raise TimedOut()
        if slot.error is not None:
            raise slot.error
        assert slot.response is not None
        return slot.response

    def close(self, reason: str = "closed by the client", refused: bool = False) -> None:
        """Fails every caller waiting on this connection and ends it."""
        with self._state:
            if self._closed is not None:
                return
            self._closed = Closed(reason, refused)
            pending, self._pending = self._pending, {}
        for slot in pending.values():
            slot.error = self._closed
            slot.event.set()
        # Wakes the reader, which closes the socket: only the reader closes
        # it, so that it never selects on a closed descriptor.
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _send(self, frame: bytes, deadline: float) -> None:
        view = memoryview(frame)
        with self._io:
            while view:
                try:
                    sent = self._sock.send(view)
                    view = view[sent:]
                    continue
                except (BlockingIOError, ssl.SSLWantWriteError):
                    wanted = selectors.EVENT_WRITE
                except ssl.SSLWantReadError:
                    wanted = selectors.EVENT_READ
                except OSError as err:
                    raise Closed(f"write failed: {err}") from None
                left = deadline - time.monotonic()
                # A frame cut in the middle leaves the stream unreadable.
                if left <= 0:
                    raise Closed("write timed out")
                with selectors.DefaultSelector() as selector:
                    selector.register(self._sock, wanted)
                    selector.select(left)

    def _read_loop(self) -> None:
        buffer = bytearray()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self._sock, selectors.EVENT_READ)
                while self._closed is None:
                    if not selector.select(1.0):
                        continue
                    with self._io:
                        try:
                            data = self._sock.recv(1 << 16)
                            # TLS: bytes already decrypted do not show in select.
                            while data and self._tls and self._sock.pending():
                                data += self._sock.recv(self._sock.pending())
                        except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                            continue
                        except ssl.SSLError as err:
                            self.close(f"TLS: {err}", refused=_is_refusal(err))
                            return
                        except OSError as err:
                            self.close(f"read failed: {err}")
                            return
                    if not data:
                        self.close("the node closed the connection")
                        return
                    buffer += data
                    if not self._take_frames(buffer):
                        return
        finally:
            self._sock.close()

    def _take_frames(self, buffer: bytearray) -> bool:
        """Delivers every whole frame in ``buffer``; False once the
        connection is closed."""
        while len(buffer) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(buffer)
            if length > FRAME_BYTES_MAX:
                speaks_tls = buffer[0] in (0x15, 0x16) and buffer[1] == 0x03
                reason = f"a frame of {length} bytes is over the client's limit"
                if speaks_tls and not self._tls:
                    reason = "the node speaks TLS: pass tls=(ca_file, cert_file, key_file)"
                self.close(reason, refused=speaks_tls)
                return False
            if len(buffer) < _HEADER.size + length:
                return True
            body = bytes(buffer[_HEADER.size : _HEADER.size + length])
            del buffer[: _HEADER.size + length]
            try:
                response = pb.Response.FromString(body)
            except Exception as err:  # protobuf's DecodeError, or worse
                self.close(f"an answer that does not decode: {err}")
                return False
            if response.id == 0:
                # About the connection itself (too many connections, a frame
                # too large): it fails everything in flight on it.
                message = response.error.message or "no reason given"
                self.close(f"the node refused the connection: {message}")
                return False
            with self._state:
                slot = self._pending.pop(response.id, None)
            # An answer whose caller gave up (timed out) is dropped here.
            if slot is not None:
                slot.response = response
                slot.event.set()
        return True


def _node_named(sock: socket.socket) -> Optional[int]:
    """The node id in the ``fencelock://node/N`` URI of the certificate the
    TLS server presented, or None."""
    getpeercert = getattr(sock, "getpeercert", None)
    if getpeercert is None:
        return None
    cert = getpeercert() or {}
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "URI" and value.startswith("fencelock://node/"):
            try:
                return int(value[len("fencelock://node/"):])
            except ValueError:
                return None
    return None


def _is_refusal(err: ssl.SSLError) -> bool:
    """A TLS alert saying that the node refused this client's certificate."""
    text = str(err).lower()
    return any(sign in text for sign in ("alert", "certificate", "unknown ca"))
