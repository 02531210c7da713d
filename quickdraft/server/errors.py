"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the right status."""

from fastapi.responses import JSONResponse


class APIError(Exception):
    """An error answered to the client as an OpenAI error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.headers = headers
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """400: the request asked for something invalid."""
    return APIError(400, message, param=param, code=code)


def queue_full(max_queue: int) -> APIError:
    return APIError(
        429,
        f"the server is busy: {max_queue} requests are already waiting; retry shortly",
        type="rate_limit_error",
        code="queue_full",
        headers={"Retry-After": "1"},
    )


def loading() -> APIError:
    return APIError(
        503, "the model is still loading; retry when GET /health returns 200", type="server_error", code="model_loading"
    )


def unauthorized() -> APIError:
    return APIError(
        401, "missing or wrong API key; send the header 'Authorization: Bearer YOUR_KEY'", code="invalid_api_key"
    )


def body_too_large(limit: int) -> APIError:
    return APIError(
        413, f"the request body is larger than {limit} bytes; send a shorter prompt", code="request_too_large"
    )


def unsupported_media_type(content_type: str) -> APIError:
    sent = f"'{content_type}'" if content_type else "no Content-Type"
    return APIError(
        415,
        f"the request body must be JSON, but {sent} was sent; send the header 'Content-Type: application/json'",
        code="unsupported_media_type",
    )


def host_not_allowed(host: str) -> APIError:
    named = f"the Host header '{host}' is not a name" if host else "a request without a Host header is not"
    return APIError(
        400,
        f"{named} this server answers to (a web page may be rebinding its name to this machine); "
        "connect as localhost or 127.0.0.1, or start the server with --allowed-hosts NAME",
        code="host_not_allowed",
    )


def request_timeout(seconds: float) -> APIError:
    return APIError(
        408, f"the request did not arrive whole within {seconds:g} s; send it at once", code="request_timeout"
    )


def headers_too_large(limit: int) -> APIError:
    return APIError(
        431, f"the request headers are larger than {limit} bytes; send smaller headers", code="headers_too_large"
    )


def not_http() -> APIError:
    return APIError(400, "the request is not valid HTTP/1.1", code="invalid_http")
