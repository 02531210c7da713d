"""What the HTTP server needs to know besides the engine: names, limits, the API key, the Host names it answers."""

import ipaddress
from dataclasses import dataclass

from quickdraft.errors import UsageError

DEFAULT_MAX_TOKENS = 256  # output tokens when a request gives no max_tokens (capped by the context)
DEFAULT_READ_TIMEOUT = 30.0  # seconds a client gets to send one whole request (server/protocol.py)
LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")  # the Host names a loopback-bound server answers by default


@dataclass(frozen=True)
class ServerSettings:
    """Validated settings of one server process."""

    model_name: str  # the name clients pass as `model`; listed by GET /v1/models
    api_key: str | None = None  # when set, every route except /health needs `Authorization: Bearer KEY`
    max_queue: int = 16  # requests that may wait while one runs; one more is answered 429 at once
    max_body_bytes: int = 1 << 20  # larger request bodies are answered 413
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    allowed_hosts: tuple[str, ...] | None = None  # Host header names (any port) answered; None: any (see below)
    read_timeout: float = DEFAULT_READ_TIMEOUT  # a request not whole after this many seconds is answered 408

    def __post_init__(self) -> None:
        _require(bool(self.model_name), "the served model name is empty; pass --served-model-name NAME")
        _require(
            self.api_key is None or bool(self.api_key.strip()),
            "the API key is empty; pass a non-empty --api-key or key file",
        )
        _require(self.max_queue >= 0, f"max_queue must be >= 0, got {self.max_queue}")
        _require(self.max_body_bytes >= 1024, f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        _require(self.read_timeout > 0, f"--read-timeout must be > 0 seconds, got {self.read_timeout:g}")
        _require(self.default_max_tokens >= 1, f"default_max_tokens must be >= 1, got {self.default_max_tokens}")


def is_loopback(host: str) -> bool:
    """Whether a bind address reaches this machine only (localhost, 127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to any address
        return False


def allowed_hosts_for(bind_host: str, allowed: str | None) -> tuple[str, ...] | None:
    """The Host names to answer: `allowed` (--allowed-hosts, a comma list, "*" for any) if given, else the
    loopback names on a loopback bind (a web page that rebinds its own name to 127.0.0.1 is refused), else any."""
    if allowed is None:
        return LOOPBACK_HOSTS if is_loopback(bind_host) else None
    names = tuple(name.strip().lower() for name in allowed.split(",") if name.strip())
    if "*" in names:
        return None
    _require(bool(names), "--allowed-hosts is empty; pass host names separated by commas, or * for any")
    for name in names:
        _require(
            ":" not in name or (name.startswith("[") and name.endswith("]")),
            f"--allowed-hosts takes names without a port (any port is answered), IPv6 in brackets, got {name!r}",
        )
    return names


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise UsageError(message)
