"""A TCP proxy in front of a server that fails what passes through it on demand: the faults an object store gives
its clients (S3 answers ``503 SlowDown`` when throttling, and connections reset mid-request), made on a real
endpoint (SeaweedFS behind it) instead of a mock. The nemesis points a pipeline's S3 endpoint at it.

:meth:`FaultProxy.fail` starts a fault for some seconds: every connection open at that moment is reset (a request in
flight, a commit half-sent, included: S3 clients keep their connections alive, so the fault must reach those too),
and each new one is reset at once (``reset``), answered ``503 SlowDown`` (``slow-down``) or ``500 InternalError`` (what
a store restarting answers: ``internal-error``) until it ends.

:meth:`FaultProxy.fail_conditional_puts` meets the next conditional PUTs (``If-None-Match``: a create only if absent)
with what a network or the store gives a writer of one: ``drop-answer`` forwards the PUT and drops the store's answer
(the client's connection reset once it came: the object is written, the writer does not know it), ``conflict``
answers ``409 ConditionalRequestConflict`` without forwarding it (S3's answer to two conditional writes of one key in
flight). :meth:`FaultProxy.pair_conditional_puts` makes two writers racing for one key meet at the store every time
(the first conditional PUT of a key waits for the second), and ``conditional_answers`` counts the store's answers to
conditional PUTs by status (412: a create refused because the object exists, or a write over a version that is no
longer there), ``refused_paths`` the paths answered 412. Conditional PUTs are those with ``If-None-Match`` or
``If-Match``.

Example::

    >>> proxy = FaultProxy(("127.0.0.1", 9))   # doctest: +SKIP
    >>> proxy.fail("slow-down", seconds=5)      # doctest: +SKIP
    >>> proxy.faults_given                       # doctest: +SKIP
    Counter({'slow-down': 12, 'reset': 3})
"""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable

FAULTS = ("reset", "slow-down", "internal-error")
CONDITIONAL_PUT_FAULTS = ("drop-answer", "conflict")
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: a close sends RST, not FIN
# The answers S3 gives (its XML error document) for the faults answered rather than reset.
_ANSWERED = {
    "slow-down": (b"503 Slow Down", b"SlowDown", b"Please reduce your request rate."),
    "internal-error": (
        b"500 Internal Server Error",
        b"InternalError",
        b"We encountered an internal error, please try again.",
    ),
    "conflict": (
        b"409 Conflict",
        b"ConditionalRequestConflict",
        b"A conflicting operation occurred. If using PutObject you can retry the request.",
    ),
}


def _error_answer(fault: str) -> bytes:
    status, code, message = _ANSWERED[fault]
    body = b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>%b</Code><Message>%b</Message></Error>' % (
        code,
        message,
    )
    head = b"HTTP/1.1 %b\r\nContent-Type: application/xml\r\nConnection: close\r\nContent-Length: %d\r\n\r\n"
    return head % (status, len(body)) + body


class FaultProxy:
    """Forwards connections on ``127.0.0.1:port`` to ``target``, in threads of this process, until :meth:`close`."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: set[_Connection] = set()
        self._fault: str | None = None
        self._until = 0.0
        self._closed = False
        self._conditional_puts: list[str] = []  # the faults the next conditional PUTs meet, in order
        self._pairing: re.Pattern[bytes] | None = None
        self._pair_hold_s = 0.0
        self._waiting: dict[bytes, threading.Event] = {}  # a conditional PUT held for its twin, by its path
        self._before: tuple[re.Pattern[bytes], Callable[[], object]] | None = None
        self.faults_given: Counter[str] = Counter()
        self.conditional_requests: Counter[str] = Counter()  # conditional writes passed, by method (PUT, POST)
        self.conditional_answers: Counter[int] = Counter()  # the store's answers to them, by status
        self.refused_paths: Counter[str] = Counter()  # the paths of those answered 412, each as often as it was
        threading.Thread(target=self._accept, name=f"fault-proxy-{self.port}", daemon=True).start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def fail(self, fault: str, seconds: float) -> None:
        """From now on for ``seconds``: every open connection reset, each new one failed by ``fault``."""
        if fault not in FAULTS:
            raise ValueError(f"fault {fault!r}: expected one of {', '.join(FAULTS)}")
        with self._lock:
            self._fault, self._until = fault, time.monotonic() + seconds
            open_now = list(self._open)
        for connection in open_now:
            connection.reset()
            self.faults_given["reset"] += 1
        for connection in open_now:  # closed once its two pumps have stopped: a request sent after this never passes
            connection.closed.wait(5)

    def fail_conditional_puts(self, fault: str, count: int = 1) -> None:
        """The next ``count`` conditional PUTs met by ``fault`` (``drop-answer`` or ``conflict``: the module's
        docstring); other requests pass."""
        if fault not in CONDITIONAL_PUT_FAULTS:
            raise ValueError(f"fault {fault!r}: expected one of {', '.join(CONDITIONAL_PUT_FAULTS)}")
        with self._lock:
            self._conditional_puts.extend([fault] * count)

    def stop_failing_conditional_puts(self) -> None:
        """Drop the faults :meth:`fail_conditional_puts` set that no conditional PUT met yet."""
        with self._lock:
            self._conditional_puts.clear()

    def before_conditional_put(self, paths: str, action: Callable[[], object]) -> None:
        """Run ``action`` once, when the next conditional PUT of a path matching the regular expression ``paths``
        arrives, before it goes on to the store: another writer's write landing between what the writer read and
        its conditional write, every time."""
        with self._lock:
            self._before = (re.compile(paths.encode()), action)

    def _run_before(self, path: bytes) -> None:
        with self._lock:
            before = self._before
            if before is None or not before[0].search(path):
                return
            self._before = None
        before[1]()

    def pair_conditional_puts(self, paths: str, hold_s: float = 3.0) -> None:
        """From now on, a conditional PUT whose path matches the regular expression ``paths`` waits (up to ``hold_s``)
        for a second conditional PUT of the same path, and both go on to the store together: two writers racing for
        one key meet at the store every time, not only when their timing happens to."""
        self._pairing, self._pair_hold_s = re.compile(paths.encode()), hold_s

    def _next_fault(self) -> str | None:
        with self._lock:
            return self._conditional_puts.pop(0) if self._conditional_puts else None

    def _meet_twin(self, path: bytes) -> None:
        """Hold a conditional PUT of ``path`` until a second one comes (or the hold ends); release the first when it
        is the second."""
        if self._pairing is None or not self._pairing.search(path):
            return
        with self._lock:
            first = self._waiting.pop(path, None)
            if first is None:
                arrived = self._waiting[path] = threading.Event()
        if first is not None:
            first.set()
            return
        arrived.wait(self._pair_hold_s)
        with self._lock:
            if self._waiting.get(path) is arrived:
                del self._waiting[path]

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        with self._lock:
            open_now = list(self._open)
        for connection in open_now:
            connection.reset()

    def _fault_now(self) -> str | None:
        with self._lock:
            return self._fault if time.monotonic() < self._until else None

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            fault = self._fault_now()
            if fault == "reset":
                self._reset(client)
                self.faults_given["reset"] += 1
            elif fault in _ANSWERED:
                threading.Thread(target=self._answer, args=(client, fault), daemon=True).start()
            else:
                threading.Thread(target=self._forward, args=(client,), daemon=True).start()

    def _answer(self, client: socket.socket, fault: str) -> None:
        """Read the request's head, answer as S3 does in ``fault`` (503 SlowDown when it throttles, 500 InternalError),
        close."""
        client.settimeout(5)
        head = b""
        try:
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = client.recv(4096)
                if not chunk:
                    break
                head += chunk
            client.sendall(_error_answer(fault))
            self.faults_given[fault] += 1
        except OSError:
            pass
        finally:
            client.close()

    def _forward(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.target, timeout=10)
        except OSError:
            self._reset(client)
            return
        upstream.settimeout(None)
        pair = _Connection(client, upstream)
        with self._lock:
            self._open.add(pair)
        threading.Thread(target=self._pump, args=(pair, upstream, client), daemon=True).start()
        self._pump(pair, client, upstream, to_store=True)

    def _pump(self, pair: _Connection, source: socket.socket, sink: socket.socket, to_store: bool = False) -> None:
        try:
            while data := source.recv(65536):
                if to_store and (path := _conditional_put_path(data)) is not None:
                    self.conditional_requests[data.split(b" ", 1)[0].decode()] += 1
                    if (fault := self._next_fault()) == "conflict":
                        self._answer_in_place(pair, fault)
                        break
                    pair.drop_answer = fault == "drop-answer"
                    pair.conditional_put, pair.conditional_path = True, path
                    self._meet_twin(path)
                    self._run_before(path)
                elif not to_store and pair.conditional_put and _final_answer(data):
                    pair.conditional_put = False
                    status = int(data.split(b" ", 2)[1])
                    self.conditional_answers[status] += 1
                    if status == 412:
                        self.refused_paths[pair.conditional_path.decode(errors="replace")] += 1
                    if pair.drop_answer:
                        pair.reset()  # the store wrote the object and answered; the client never hears it
                        self.faults_given["drop-answer"] += 1
                        break
                sink.sendall(data)
        except OSError:
            pass
        if not pair.resetting:
            with contextlib.suppress(OSError):
                sink.shutdown(socket.SHUT_WR)  # the end of one direction passed on; the other may go on
        if pair.direction_ended():  # the second to end closes both: with a reset, RST to both peers
            with self._lock:
                self._open.discard(pair)
            pair.close()

    def _answer_in_place(self, pair: _Connection, fault: str) -> None:
        """Answer the request the client just began with ``fault``'s error instead of the store (which never sees
        it), read what the client still sends of it, and close: the client reads the answer, not a reset."""
        client, upstream = pair.sockets
        pair.resetting = True  # the other pump, woken by the upstream's close, passes nothing on
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_RDWR)
        try:
            client.sendall(_error_answer(fault))
            self.faults_given[fault] += 1
            client.shutdown(socket.SHUT_WR)
            client.settimeout(2)
            while client.recv(65536):  # the body, if the client sends it: read and dropped
                pass
        except OSError:
            pass

    @staticmethod
    def _reset(connection: socket.socket) -> None:
        """Close with a TCP reset (SO_LINGER 0), as a dropped connection reaches the client."""
        try:
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
            connection.close()
        except OSError:
            pass


def _conditional_put_path(data: bytes) -> bytes | None:
    """The path of the request ``data`` begins, when it is a conditional write (``If-None-Match``: a create only if
    absent, or ``If-Match``: a write over one version only; a PUT, or the POST completing a multipart upload), else
    None."""
    if not data.startswith((b"PUT ", b"POST ")):
        return None
    head = data.split(b"\r\n\r\n", 1)[0].lower()
    conditional = b"\r\nif-none-match:" in head or b"\r\nif-match:" in head
    return data.split(b" ", 2)[1] if conditional else None


def _final_answer(data: bytes) -> bool:
    """Whether ``data`` from the store holds a final answer (``100 Continue`` alone is not one)."""
    return data.startswith(b"HTTP/") and not (data.startswith(b"HTTP/1.1 100") and data.count(b"HTTP/") == 1)


class _Connection:
    """A client's connection and its upstream one, forwarded both ways by two threads."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.sockets = (client, upstream)
        self.resetting = False
        self.conditional_put = False  # a conditional PUT passed to the store: its answer is counted
        self.drop_answer = False  # ... and dropped
        self.conditional_path = b""  # ... of this path
        self.closed = threading.Event()
        self._ended = 0
        self._lock = threading.Lock()

    def reset(self) -> None:
        """Make both pumps stop at once (a shutdown of reading wakes a blocked recv) and close with RST."""
        self.resetting = True
        for connection in self.sockets:
            try:
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
                connection.shutdown(socket.SHUT_RD)
            except OSError:
                pass

    def direction_ended(self) -> bool:
        """Count one direction as ended; True for the second."""
        with self._lock:
            self._ended += 1
            return self._ended == 2

    def close(self) -> None:
        for connection in self.sockets:
            connection.close()
        self.closed.set()
