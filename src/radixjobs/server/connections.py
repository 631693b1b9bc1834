"""Bounds on the status endpoint's connections, so no HTTP client can take the scheduler's descriptors.

Invariants:
- at most ``max_connections`` HTTP connections are open at once; one more is closed as soon as it is
  accepted (before any byte is read), so an idle flood costs a bounded number of descriptors;
- a new HTTP connection is also closed when fewer than ``reserve`` descriptors of the soft
  ``RLIMIT_NOFILE`` would stay free (counted in ``/proc/self/fd`` where it exists): the scheduler's own
  PostgreSQL connections (pools, principal sessions, listeners) always find a descriptor;
- a client gets ``request_timeout`` seconds from connecting (or from the end of the previous response) to
  send one complete request, headers and body; a client that sends nothing, or a byte at a time, is
  disconnected when that time is up;
- a request whose line and headers take more than ``MAX_HEADER_BYTES`` is answered 431 and its connection
  closed, whether the head arrived in pieces (h11's own limit on an incomplete event) or all at once (h11
  parses a complete head of any size: ``HeadLimitedConnection`` measures it).

uvicorn has the keep-alive timeout and a header size limit but no request-read timeout (its keep-alive
timer is disarmed by any byte received, and ``limit_concurrency`` answers 503 only after a whole request
was read, holding the descriptor meanwhile; it answers every malformed request 400, ignoring h11's status
hint), so this is a small subclass of its h11 protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_HEADER_BYTES = 8 * 1024
DEFAULT_REQUEST_TIMEOUT_S = 10.0
MAX_DEFAULT_CONNECTIONS = 64
BASE_RESERVE = 64  # stdio, log and lock files, the listening socket, the runtime's own descriptors
RESERVE_PER_ATTEMPT = 4  # a principal session in use, an idle one kept, document service pipes
NOFILE_TARGET = 1 << 16
_FD_DIR = "/proc/self/fd"


def raise_nofile_limit() -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard limit (up to NOFILE_TARGET, more helps nothing here);
    returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = NOFILE_TARGET if hard == resource.RLIM_INFINITY else min(hard, NOFILE_TARGET)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def scheduler_reserve(concurrency: int) -> int:
    """Descriptors kept for the scheduler itself, whatever HTTP clients do."""
    return BASE_RESERVE + RESERVE_PER_ATTEMPT * concurrency


def default_max_connections(soft_limit: int, reserve: int) -> int:
    """Half of what the reserve leaves, at most MAX_DEFAULT_CONNECTIONS, at least 1."""
    return max(1, min(MAX_DEFAULT_CONNECTIONS, (soft_limit - reserve) // 2))


def open_descriptors() -> int | None:
    """Descriptors this process has open, or None where that cannot be counted cheaply."""
    try:
        return len(os.listdir(_FD_DIR))
    except OSError:
        return None


@dataclass(frozen=True)
class HttpLimits:
    max_connections: int
    request_timeout_s: float
    reserve: int
    soft_limit: int

    def descriptors_short(self) -> bool:
        """Would one more descriptor eat into the scheduler's reserve?"""
        used = open_descriptors()
        return used is not None and used + self.reserve >= self.soft_limit


def head_bytes(request: h11.Request) -> int:
    """The size of a request's line and headers as sent (less optional whitespace h11 dropped)."""
    line = len(request.method) + len(request.target) + len(b"  HTTP/1.1\r\n")
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers.raw_items()) + 2


class HeadLimitedConnection(h11.Connection):
    """h11's server connection refusing a complete request head over MAX_HEADER_BYTES too; ``refusal`` is
    the status the last protocol error deserves."""

    refusal = 400

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            self.refusal = exc.error_status_hint
            raise
        if isinstance(event, h11.Request) and head_bytes(event) > MAX_HEADER_BYTES:
            self.refusal = 431
            raise h11.RemoteProtocolError("request header fields too large", error_status_hint=431)
        return event


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a connection cap, a deadline for each request to arrive and a bound on
    each request's head."""

    limits: ClassVar[HttpLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn = HeadLimitedConnection(h11.SERVER, MAX_HEADER_BYTES)
        self._request_deadline: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections or self.limits.descriptors_short():
            self._refused = True
            self.transport = transport
            transport.abort()  # frees the descriptor now, nothing read or written
            return
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._refused:
            return
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()  # the whole request is in: the answer is ours to give

    def on_response_complete(self) -> None:
        self._arm()  # the next request (keep-alive or pipelined) gets its own deadline
        super().on_response_complete()
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()  # a pipelined request was already complete

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a malformed request, with the status it deserves (431: head too large)."""
        status = self.conn.refusal if isinstance(self.conn, HeadLimitedConnection) else 400
        text = "request header fields too large" if status == 431 else msg
        headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")]
        for event in (h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase),
                      h11.Data(data=text.encode("ascii")), h11.EndOfMessage()):
            self.transport.write(self.conn.send(event) or b"")
        self.transport.close()

    def _arm(self) -> None:
        self._disarm()
        self._request_deadline = self.loop.call_later(self.limits.request_timeout_s, self._expire)

    def _disarm(self) -> None:
        if self._request_deadline is not None:
            self._request_deadline.cancel()
            self._request_deadline = None

    def _expire(self) -> None:
        self._request_deadline = None
        if not self.transport.is_closing():
            self.transport.abort()


def protocol_class(limits: HttpLimits) -> type[BoundedH11Protocol]:
    """The protocol class uvicorn instantiates per connection, bound to ``limits``."""
    return type("RadixHttpProtocol", (BoundedH11Protocol,), {"limits": limits})
