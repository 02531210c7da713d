"""ASGI middleware: the API key check and the request body size limit.

Both are plain ASGI (not Starlette's BaseHTTPMiddleware), so streaming responses and client
disconnects pass through untouched.
"""

import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from quickdraft.server.errors import body_too_large, unauthorized

OPEN_PATHS = frozenset({"/health"})  # answered without a key, so load balancers can probe


class ApiKeyMiddleware:
    """Every route except /health needs `Authorization: Bearer KEY`, compared in constant time."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        await unauthorized().response()(scope, receive, send)

    def _authorized(self, scope: Scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        return hmac.compare_digest(token.strip(), self._key) and scheme.lower() == b"bearer"


class BodyLimitMiddleware:
    """Answers 413 to bodies over `limit` bytes: at once from Content-Length, else while reading."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length", b"0")
        if declared.isdigit() and int(declared) > self.limit:
            await body_too_large(self.limit).response()(scope, receive, send)
            return
        await self.app(scope, self._counting(receive), send)

    def _counting(self, receive: Receive) -> Receive:
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise body_too_large(self.limit)
            return message

        return receive_within_limit
