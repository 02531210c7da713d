"""The HTTP/1.1 connection: uvicorn's h11 protocol, with a deadline for reading each request and a clean refusal.

Two things uvicorn's own protocol leaves to a proxy in front of it:
- A client that sends part of its headers or body and then nothing more holds a connection forever. Here each
  request must arrive whole within `read_timeout` seconds of the connection opening or of the previous response
  ending (so dripping a byte at a time does not help); otherwise it is answered 408 and the connection closes.
  A connection that has sent nothing by then is closed without an answer, as an idle keep-alive one is.
- Headers over h11's buffer limit (16 KiB) are answered 431, not 400. A refused connection is half-closed and
  what the client still sends is read and dropped for up to LINGER_SECONDS: closing with unread bytes would make
  the kernel send a reset, and the client would never read the answer.

This subclasses `uvicorn.protocols.http.h11_impl.H11Protocol` (its `conn`, `cycle`, `transport` and
`send_400_response`); tests/test_server.py holds each behaviour, so an uvicorn release that changes them fails there.
"""

import asyncio
import json
from http import HTTPStatus
from typing import Any

import h11
from h11._connection import DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from quickdraft.server.errors import APIError, headers_too_large, not_http, request_timeout
from quickdraft.server.settings import DEFAULT_READ_TIMEOUT

LINGER_SECONDS = 2.0  # how long a refused connection keeps reading what the client still sends
READING = (h11.IDLE, h11.SEND_BODY)  # the client's states while its request is still arriving


class GuardedH11Protocol(H11Protocol):
    """One connection; `read_timeout` bounds how long its requests may take to arrive (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.read_timeout = read_timeout
        self.header_limit = config.h11_max_incomplete_event_size or DEFAULT_MAX_INCOMPLETE_EVENT_SIZE
        self._read_deadline: asyncio.TimerHandle | None = None
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._watch_request()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # read and dropped: see _refuse
        super().data_received(data)
        self._watch_request()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch_request()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_deadline()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """uvicorn calls this when h11 cannot parse the request; an over-long header block is 431."""
        too_large = len(self.conn.trailing_data[0]) > self.header_limit
        self._refuse(headers_too_large(self.header_limit) if too_large else not_http())

    def _watch_request(self) -> None:
        """A deadline runs while a request is arriving; none while it is answered."""
        if self.transport.is_closing() or self._refused or self.conn.their_state not in READING:
            self._stop_deadline()
        elif self._read_deadline is None:
            self._read_deadline = self.loop.call_later(self.read_timeout, self._read_timed_out)

    def _stop_deadline(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        if self.transport.is_closing() or self.conn.their_state not in READING:
            return
        if self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
            self.transport.close()  # an idle connection, nothing half-sent: closed quietly, as keep-alive would
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "a client"
        self.logger.warning(f"{client} did not send a whole request within {self.read_timeout:g} s; closed")
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True  # the route reading the body gets http.disconnect
            self.cycle.message_event.set()
        if self.cycle is not None and self.cycle.response_started:
            self.transport.close()
        else:
            self._refuse(request_timeout(self.read_timeout))

    def _refuse(self, error: APIError) -> None:
        """Answer `error`, then close after reading what is still coming."""
        self._refused = True
        self._stop_deadline()
        body = json.dumps(error.body()).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        try:
            response = h11.Response(
                status_code=error.status,
                headers=[*headers, (b"connection", b"close")],
                reason=HTTPStatus(error.status).phrase,
            )
            self.transport.write(self.conn.send(response) + self.conn.send(h11.Data(data=body)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
        except h11.LocalProtocolError:  # a response was already under way: nothing more can be said on it
            self.transport.close()
            return
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER_SECONDS, self.transport.close)
