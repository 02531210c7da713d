"""What the HTTP server needs to know besides the engine: names, limits, the API key."""

from dataclasses import dataclass

from quickdraft.errors import UsageError

DEFAULT_MAX_TOKENS = 256  # output tokens when a request gives no max_tokens (capped by the context)


@dataclass(frozen=True)
class ServerSettings:
    """Validated settings of one server process."""

    model_name: str  # the name clients pass as `model`; listed by GET /v1/models
    api_key: str | None = None  # when set, every route except /health needs `Authorization: Bearer KEY`
    max_queue: int = 16  # requests that may wait while one runs; one more is answered 429 at once
    max_body_bytes: int = 1 << 20  # larger request bodies are answered 413
    default_max_tokens: int = DEFAULT_MAX_TOKENS

    def __post_init__(self) -> None:
        _require(bool(self.model_name), "the served model name is empty; pass --served-model-name NAME")
        _require(
            self.api_key is None or bool(self.api_key.strip()),
            "the API key is empty; pass a non-empty --api-key or key file",
        )
        _require(self.max_queue >= 0, f"max_queue must be >= 0, got {self.max_queue}")
        _require(self.max_body_bytes >= 1024, f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        _require(self.default_max_tokens >= 1, f"default_max_tokens must be >= 1, got {self.default_max_tokens}")


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise UsageError(message)
