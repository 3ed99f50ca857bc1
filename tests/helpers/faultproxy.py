"""A fault-injecting HTTP/1.1 proxy on 127.0.0.1, for tests and benchmarks of remote stores.

It sits between a client (``AWS_ENDPOINT_URL`` pointed at ``proxy.endpoint``) and a real server,
relays each request and response of every keep-alive connection, and logs ``(method, path)`` of
every request, so tests count GETs of an object from the wire. Network conditions:

- ``rtt``: seconds added to every request's round trip (and once to each new connection, as a
  TCP handshake would);
- ``rate``: bytes per second of one link shared by every connection (response and request bodies
  are paced on it), ``None`` for no cap. Like a real shaped link (a token bucket), it holds a
  ``burst`` of bytes (``BURST``, one 16 KiB chunk): idle time up to ``burst / rate`` (a sender
  thread woken late on a busy machine) is made up by sending that much at once; no stretch of
  time carries more than ``rate`` x its length + ``burst``.

Timeline, for benchmarks and tests: ``transfers`` holds one :class:`Transfer` per request (when it
came, when its response body started and ended, in ``time.monotonic()``), ``busy`` the intervals
the shaped link was sending, and ``wait_for(predicate)`` blocks until the request log satisfies
``predicate`` (events, not sleeps).

Faults, each matched by method and path (query string ignored) and used ``times`` times:

- ``"reset"``: after ``at`` bytes of the response body the connection is reset (RST);
- ``"truncate"``: after ``at`` bytes of the response body the connection is closed (FIN);
- ``"stall"``: after ``at`` bytes of the response body nothing more is sent until ``release()``
  (or ``stop()``), then the connection is closed;
- ``"flip"``: the byte at offset ``at`` of the body (the request's for PUT/POST, else the
  response's) has its lowest bit flipped;
- ``"trickle"``: after ``at`` bytes of the response body, one byte every ``trickle_interval``
  seconds (never long enough for a read timeout) until ``release()`` (or ``stop()``), then the
  rest at once; ``trickling`` is set when it starts;
- ``"answer"`` (:meth:`FaultProxy.answer`): the request is not relayed; the proxy answers it
  with an S3 error (an HTTP status and an S3 error code), as a server that refuses it would.

A fault's path ending in ``*`` matches every path that starts with what comes before it; its
``after`` matching requests are relayed untouched before it applies (a token that expires after
the 10th GET).
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass

KINDS = ("reset", "truncate", "stall", "flip", "trickle", "answer")
_CHUNK = 16384
# Bytes a shaped link sends at once after sitting idle: one chunk makes up for a sender thread
# woken a few ms late, not for a client's gap (at 2 MB/s, 8 ms; a +20 ms round trip still shows).
BURST = _CHUNK


@dataclass
class Transfer:
    """One request through the proxy, in ``time.monotonic()`` seconds."""

    method: str
    path: str
    requested: float  # its request head arrived
    started: float | None = None  # its response head was sent on
    done: float | None = None  # its response body was sent in full
    bytes: int = 0  # response body bytes sent


@dataclass
class Fault:
    method: str
    path: str
    kind: str
    at: int = 0
    times: int | None = 1  # None: every matching request
    used: int = 0
    after: int = 0  # matching requests relayed untouched before the fault applies
    seen: int = 0
    status: int = 0  # "answer": the HTTP status and S3 error code answered
    code: str = ""

    def matches(self, method: str, path: str) -> bool:
        if self.method != method:
            return False
        if self.path.endswith("*"):
            return path.startswith(self.path[:-1])
        return self.path == path


class _Closed(Exception):
    """The connection ends here (a fault, or a peer that went away)."""


class FaultProxy:
    """``with FaultProxy(upstream_endpoint, rtt=0.1) as proxy:`` ... ``proxy.endpoint``."""

    def __init__(self, upstream: str, rtt: float = 0.0, rate: float | None = None,
                 burst: int = BURST) -> None:
        host, port = upstream.removeprefix("http://").rstrip("/").rsplit(":", 1)
        self.upstream = (host, int(port))
        self.rtt = rtt
        self.rate = rate
        self.burst = burst
        self.requests: list[tuple[str, str]] = []
        self.transfers: list[Transfer] = []
        self.busy: list[list[float]] = []  # [start, end] when the shaped link sent (merged)
        self.faults: list[Fault] = []
        self.stalled = threading.Event()  # set when a stall fault starts holding a body
        self.trickling = threading.Event()  # set when a trickle fault starts
        self.trickle_interval = 0.1
        self._released = threading.Event()
        self._lock = threading.RLock()  # shared with _logged: one lock for every record
        self._logged = threading.Condition(self._lock)
        self._link_free = 0.0  # when the shaped link is next idle (time.monotonic)
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._stopping = False

    # -- control ------------------------------------------------------------------------------

    def start(self) -> "FaultProxy":
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._acceptor = threading.Thread(target=self._accept, daemon=True, name="faultproxy")
        self._acceptor.start()
        return self

    def stop(self) -> None:
        self._stopping = True
        self._released.set()
        if self._listener is not None:
            # close() alone does not wake a thread blocked in accept() on Linux: the accept
            # thread then outlived the proxy, and a process with another thread alive makes
            # every later pack in it spawn its workers instead of forking them.
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._acceptor.join(10)
        with self._lock:
            for sock in list(self._sockets):
                _close(sock)

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def add(self, method: str, path: str, kind: str, at: int = 0,
            times: int | None = 1, after: int = 0) -> Fault:
        """Inject fault ``kind`` into the next ``times`` requests ``method path`` (after the
        first ``after`` of them)."""
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        fault = Fault(method, path, kind, at, times, after=after)
        with self._lock:
            self.faults.append(fault)
        return fault

    def answer(self, method: str, path: str, status: int, code: str, times: int | None = 1,
               after: int = 0) -> Fault:
        """Answer the next ``times`` requests ``method path`` (after the first ``after``) with
        the S3 error ``code`` and HTTP ``status``, without relaying them."""
        fault = self.add(method, path, "answer", times=times, after=after)
        fault.status, fault.code = status, code
        return fault

    def clear(self) -> None:
        """Remove every fault."""
        with self._lock:
            self.faults.clear()

    def release(self) -> None:
        """Let stalled responses go (their connections are then closed)."""
        self._released.set()

    def wait_for(self, predicate, timeout: float = 60.0) -> bool:
        """Block until ``predicate(requests)`` is true for the request log (``(method, path)``
        pairs), or ``timeout`` seconds pass (a guard against a hang, not a measurement)."""
        with self._logged:
            return self._logged.wait_for(lambda: predicate(list(self.requests)), timeout)

    def count(self, method: str, path: str) -> int:
        with self._lock:
            return sum(1 for m, p in self.requests if m == method and p == path)

    # -- relay --------------------------------------------------------------------------------

    def _accept(self) -> None:
        assert self._listener is not None
        while not self._stopping:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(client,), daemon=True).start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)

    def _connection(self, client: socket.socket) -> None:
        self._track(client)
        server = None
        try:
            time.sleep(self.rtt)  # the handshake's round trip
            server = socket.create_connection(self.upstream)
            self._track(server)
            cin, sin = client.makefile("rb"), server.makefile("rb")
            while not self._stopping:
                if not self._exchange(client, cin, server, sin):
                    break
        except (_Closed, OSError):
            pass
        finally:
            _close(client)
            if server is not None:
                _close(server)
            with self._lock:
                self._sockets.discard(client)
                self._sockets.discard(server)

    def _match(self, method: str, path: str) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.matches(method, path) and (
                        fault.times is None or fault.used < fault.times):
                    fault.seen += 1
                    if fault.seen <= fault.after:
                        continue
                    fault.used += 1
                    return fault
        return None

    def _exchange(self, client, cin, server, sin) -> bool:
        """One request and its response; False when the connection ends."""
        head = _read_head(cin)
        if head is None:
            return False
        method, target = head[0].split(b" ", 2)[:2]
        method_s, path = method.decode(), target.decode().split("?", 1)[0]
        transfer = Transfer(method_s, path, time.monotonic())
        with self._logged:
            self.requests.append((method_s, path))
            self.transfers.append(transfer)
            self._logged.notify_all()
        fault = self._match(method_s, path)
        headers = _headers(head)
        on_request = fault is not None and fault.kind == "flip" and method_s in ("PUT", "POST")
        if fault is not None and fault.kind == "answer":
            return self._answer(client, cin, headers, fault, transfer)
        if headers.get(b"expect", b"").lower() == b"100-continue":
            # Answered here: servers that never send "100 Continue" would cost a client timeout.
            head = [line for line in head if not line.lower().startswith(b"expect:")]
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        server.sendall(b"\r\n".join(head) + b"\r\n\r\n")
        self._body(cin, headers, server, fault if on_request else None, request=True)
        time.sleep(self.rtt)
        response = _read_head(sin)
        if response is None:
            raise _Closed
        client.sendall(b"\r\n".join(response) + b"\r\n\r\n")
        transfer.started = time.monotonic()
        try:
            return self._finish(client, sin, response, method_s, None if on_request else fault,
                                transfer)
        finally:
            transfer.done = time.monotonic()

    def _answer(self, client, cin, headers, fault: Fault, transfer: Transfer) -> bool:
        """Answer a request with ``fault``'s S3 error, its body read and dropped."""

        class _Drop:
            @staticmethod
            def sendall(data: bytes) -> None:
                pass

        if headers.get(b"expect", b"").lower() == b"100-continue":
            client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._body(cin, headers, _Drop, None, request=True)
        time.sleep(self.rtt)
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{fault.code}</Code>'
                f"<Message>injected {fault.code}</Message><RequestId>0</RequestId></Error>"
                ).encode()
        head = (f"HTTP/1.1 {fault.status} {fault.code}\r\nContent-Type: application/xml\r\n"
                f"Content-Length: {len(body)}\r\nx-amz-request-id: 0\r\n\r\n").encode()
        transfer.started = time.monotonic()
        client.sendall(head if transfer.method == "HEAD" else head + body)  # HEAD: no body
        transfer.done = time.monotonic()
        return True

    def _finish(self, client, sin, response, method, fault, transfer=None) -> bool:
        status = int(response[0].split(b" ", 2)[1])
        headers = _headers(response)
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return headers.get(b"connection", b"").lower() != b"close"
        until_close = (b"content-length" not in headers
                       and headers.get(b"transfer-encoding", b"").lower() != b"chunked")
        self._body(sin, headers, client, fault, request=False, transfer=transfer)
        return not until_close and headers.get(b"connection", b"").lower() != b"close"

    def _body(self, src, headers, dst: socket.socket, fault: Fault | None, request: bool,
              transfer: Transfer | None = None) -> None:
        """Relay one message body (Content-Length, chunked, or until close), applying ``fault``."""
        sent = 0

        def send(data: bytes) -> None:
            nonlocal sent
            if fault is not None and fault.kind == "flip" and sent <= fault.at < sent + len(data):
                i = fault.at - sent
                data = data[:i] + bytes([data[i] ^ 1]) + data[i + 1:]
            if fault is not None and fault.kind == "trickle" and sent + len(data) > fault.at:
                head = max(0, fault.at - sent)
                self._pace(dst, data[:head])
                self.trickling.set()
                for i in range(head, len(data)):
                    if self._released.is_set():
                        self._pace(dst, data[i:])
                        break
                    dst.sendall(data[i:i + 1])
                    self._released.wait(self.trickle_interval)
                sent += len(data)
                return
            if fault is not None and fault.kind not in ("flip", "trickle") and \
                    sent + len(data) > fault.at:
                self._pace(dst, data[:fault.at - sent])
                self._break(dst, fault.kind)
            self._pace(dst, data)
            sent += len(data)
            if transfer is not None:
                transfer.bytes = sent

        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            while True:
                line = src.readline()
                if not line:
                    raise _Closed
                send(line)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while True:  # trailers, then the empty line
                        trailer = src.readline()
                        if not trailer:
                            raise _Closed
                        send(trailer)
                        if trailer in (b"\r\n", b"\n"):
                            return
                _copy(src, size + 2, send)
        elif b"content-length" in headers:
            _copy(src, int(headers[b"content-length"]), send)
        elif not request:
            while True:
                data = src.read1(_CHUNK)
                if not data:
                    return
                send(data)

    def _break(self, sock: socket.socket, kind: str) -> None:
        if kind == "stall":
            self.stalled.set()
            self._released.wait()
        elif kind == "reset":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        raise _Closed

    def _pace(self, sock: socket.socket, data: bytes) -> None:
        for i in range(0, len(data), _CHUNK):
            piece = data[i:i + _CHUNK]
            if self.rate:
                with self._lock:
                    now = time.monotonic()
                    # Idle up to a burst's worth is owed to a late sender: the bucket's tokens.
                    start = max(now - self.burst / self.rate, self._link_free)
                    self._link_free = start + len(piece) / self.rate
                    wait = self._link_free - now
                    busy = (start, self._link_free)  # bytes / rate in all, burst included
                    if self.busy and self.busy[-1][1] >= busy[0]:
                        self.busy[-1][1] = max(self.busy[-1][1], busy[1])
                    else:
                        self.busy.append(list(busy))
                if wait > 0:
                    time.sleep(wait)
            sock.sendall(piece)


def _read_head(stream) -> list[bytes] | None:
    lines = []
    while True:
        line = stream.readline(65537)
        if not line:
            if lines:
                raise _Closed
            return None
        line = line.rstrip(b"\r\n")
        if not line:
            if not lines:
                continue  # stray CRLF between messages
            return lines
        lines.append(line)


def _headers(head: list[bytes]) -> dict[bytes, bytes]:
    out = {}
    for line in head[1:]:
        name, _, value = line.partition(b":")
        out[name.strip().lower()] = value.strip()
    return out


def _copy(src, n: int, send) -> None:
    while n > 0:
        data = src.read(min(n, _CHUNK))
        if not data:
            raise _Closed
        send(data)
        n -= len(data)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
