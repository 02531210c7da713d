"""ASGI middleware: the Host check, the API key check, JSON-only bodies and the request body size limit.

All are plain ASGI (not Starlette's BaseHTTPMiddleware), so streaming responses and client
disconnects pass through untouched. The Host and JSON checks keep web pages away from a local
server: a page can make a browser POST a text/plain or form body to any address with no CORS
preflight, but a JSON body needs one (and this server grants none), and a page that rebinds its
own name to 127.0.0.1 still sends that name as the Host.
"""

import hmac

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from quickdraft.server.errors import body_too_large, host_not_allowed, unauthorized, unsupported_media_type
from quickdraft.server.page import PAGE_FILES

OPEN_PATHS = frozenset({"/health", *PAGE_FILES})  # without a key: load balancers probe, the page asks for the key


class AllowedHostsMiddleware:
    """Answers 400 to a request whose Host header (port aside) is not one of `hosts`."""

    def __init__(self, app: ASGIApp, hosts: tuple[str, ...]) -> None:
        self.app = app
        self.hosts = frozenset(host.lower() for host in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        host = _header(scope, b"host")
        if scope["type"] != "http" or host_name(host) in self.hosts:
            await self.app(scope, receive, send)
            return
        await host_not_allowed(host).response()(scope, receive, send)


def host_name(host: str) -> str:
    """The name of a Host header without its port, lower-cased: `[::1]:8000` -> `[::1]`."""
    name = host[: host.index("]") + 1] if host.startswith("[") and "]" in host else host.rpartition(":")[0] or host
    return name.lower()


class JsonBodyMiddleware:
    """Answers 415 to a POST whose Content-Type is not application/json (parameters such as charset allowed)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        content_type = _header(scope, b"content-type")
        media_type = content_type.partition(";")[0].strip().lower()
        if scope["type"] != "http" or scope["method"] != "POST" or media_type == "application/json":
            await self.app(scope, receive, send)
            return
        await unsupported_media_type(content_type).response()(scope, receive, send)


def _header(scope: Scope, name: bytes) -> str:
    return dict(scope.get("headers", ())).get(name, b"").decode("latin-1")


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
