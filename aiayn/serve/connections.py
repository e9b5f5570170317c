"""Connections that cannot starve the server: uvicorn's HTTP protocol (httptools) with a read
deadline and a cap on open connections; and a client that goes away takes its texts out of
the queue (`unless_gone`).

uvicorn reads a request for as long as its client takes, and accepts connections until the
process runs out of file descriptors: a few thousand clients that send half a request and then
nothing (slowloris) hold every descriptor, and even /health goes unanswered. Here:

- a request must arrive whole, headers and body, within `read_timeout` seconds of its first byte
  (or of its connection's opening); a slower one is answered 408 and its connection closed;
- at most `max_connections` connections are open: a new one over the cap closes the connections
  that are not being answered (a request still arriving, or an idle keep-alive), oldest first;
  only when every connection has a request in hand is the new one answered 503.
"""

from __future__ import annotations

import asyncio
import json
import resource
from typing import Optional

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from aiayn.config import SERVE
from aiayn.serve.batcher import Closed, QueueFull

# Descriptors kept for what is not a client: the model's files, the log, the listening socket.
RESERVED_DESCRIPTORS = 64


def raw_response(status: int, reason: str, message: str, retry_after: Optional[int] = None) -> bytes:
    """A whole HTTP/1.1 answer with a JSON error body, for a connection the app never sees."""
    body = json.dumps({"error": message}).encode()
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json", f"content-length: {len(body)}",
            "connection: close"] + ([f"retry-after: {retry_after}"] if retry_after is not None else [])
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def connection_cap(wanted: int) -> int:
    """`wanted`, lowered to what the process's descriptor limit leaves for clients."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    return max(1, min(wanted, soft - RESERVED_DESCRIPTORS))


class GuardedProtocol(HttpToolsProtocol):
    """HttpToolsProtocol with a read deadline per request and a cap on open connections (the
    class attributes; `guarded_protocol` makes a subclass with other values)."""

    read_timeout: float = SERVE.read_timeout
    max_connections: int = SERVE.max_connections

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._timer = None
        self._reading_since: Optional[float] = None
        self._start_reading()
        if len(self.connections) > self.max_connections:
            self._make_room()

    def connection_lost(self, exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._start_reading()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading_since = None  # read whole: the app has it now

    def _start_reading(self) -> None:
        if self._reading_since is None:
            self._reading_since = self.loop.time()
        if self._timer is None:
            self._timer = self.loop.call_at(self._reading_since + self.read_timeout, self._deadline)

    def _deadline(self) -> None:
        self._timer = None
        if self._reading_since is None or self.transport.is_closing():
            return
        late = self._reading_since + self.read_timeout - self.loop.time()
        if late > 0:  # a later request on this connection: its own deadline
            self._timer = self.loop.call_later(late, self._deadline)
            return
        self._close(raw_response(408, "Request Timeout", f"the request did not arrive whole within "
                                                         f"{self.read_timeout:g} s"))

    def _idle(self) -> bool:
        """Not being answered: a request still arriving, or nothing asked since the last answer."""
        return self._reading_since is not None or self.cycle is None or self.cycle.response_complete

    def _close(self, answer: bytes) -> None:
        """Close the connection with `answer` unless a response has begun on it. An app still
        reading the body hears that its client is gone."""
        if self.cycle is None or not self.cycle.response_started:
            self.transport.write(answer)
        self.transport.close()

    def _make_room(self) -> None:
        others = sorted((c for c in self.connections if c is not self and isinstance(c, GuardedProtocol)
                         and c._idle() and not c.transport.is_closing()),
                        key=lambda c: c._reading_since if c._reading_since is not None else float("-inf"))
        for other in others[: len(self.connections) - self.max_connections]:
            other._close(raw_response(503, "Service Unavailable", "the server has too many connections; "
                                                                  "this one was idle and is closed", retry_after=1))
        if len([c for c in self.connections if not c.transport.is_closing()]) > self.max_connections:
            self._close(raw_response(503, "Service Unavailable",
                                     f"the server is answering {self.max_connections} connection"
                                     f"{'s' if self.max_connections != 1 else ''}; retry shortly", retry_after=1))


def guarded_protocol(read_timeout: float = SERVE.read_timeout, max_connections: int = SERVE.max_connections) -> type:
    """GuardedProtocol with these limits, for uvicorn.Config(http=...)."""
    return type("GuardedProtocol", (GuardedProtocol,),
                {"read_timeout": read_timeout, "max_connections": connection_cap(max_connections)})


class DecodingFailed(Exception):
    """Decoding a request's texts raised its cause: the request gets a 500 from the app's handler
    of this class, which runs inside the middleware (an exception no handler names is answered
    outside it, without the CORS headers a web app needs to read the error: found in review)."""


async def unless_gone(submission, request) -> Optional[list]:
    """What the coroutine `submission` (a `Batcher.submit`) returns, or None when the client of
    `request` (a starlette Request whose body has been read) closes its connection first: its
    texts then leave the queue undecoded, and hold no room another client could use."""
    decoding = asyncio.ensure_future(submission)

    async def disconnected() -> None:  # the body is read: the next ASGI message is the disconnect
        while (await request.receive())["type"] != "http.disconnect":
            pass

    gone = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({decoding, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not decoding.done():
        decoding.cancel()
        return None
    try:
        return decoding.result()
    except (QueueFull, Closed):
        raise
    except Exception as error:  # noqa: BLE001 - whatever decoding raised, this request's answer says
        raise DecodingFailed() from error
