"""Request bodies of /v1/chat/completions and /v1/completions, validated strictly.

Known fields are checked for type and range (strict JSON types: `"5"` is not a number); unknown
fields are ignored, as most OpenAI-compatible servers do. OpenAI features quickdraft does not
implement (several choices, penalties, log-probabilities, tools, audio) are accepted only at their
neutral values, so a request is never silently answered differently from what it asked.
`parse_request` turns every validation failure into a 400 OpenAI error naming the parameter.
"""

import json
from typing import Annotated, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quickdraft.server.errors import APIError, invalid

MAX_STOP_STRINGS = 4  # as OpenAI
INT64_MIN, UINT64_MAX = -(2**63), 2**64 - 1  # the seeds torch.Generator.manual_seed accepts


class _Strict(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None  # null or missing is refused with a message naming it
    name: str | None = None
    tool_calls: list[dict] | None = None  # refused: quickdraft calls no tools

    def text(self) -> str:
        if isinstance(self.content, list):
            return "\n".join(part.text for part in self.content)
        return self.content or ""

    def unsupported(self, index: int) -> list[tuple[bool, str, str]]:
        where = f"messages[{index}]"
        return [
            (
                bool(self.tool_calls),
                f"{where}.tool_calls",
                f"{where}.tool_calls: tool calls are not supported; send the assistant's answer as text content",
            ),
            (
                self.content is None,
                f"{where}.content",
                f"{where}.content is null or missing; send the message's text as a string (an empty one if need be)",
            ),
        ]


class StreamOptions(_Strict):
    include_usage: bool = False


class QuickdraftOptions(_Strict):
    """Per-request speculation overrides, under the `quickdraft` key."""

    drafter: str | None = None  # "none", "ngram", "ngram:MIN-MAX" or the server's --drafter
    k: Literal["auto"] | Annotated[int, Field(ge=0, le=64)] | None = (
        None  # "auto" or a fixed N per step; 0 disables drafting
    )
    spans: bool = False  # stream chunks carry `spans`: their text by source (a drafter, or the target)


class GenerationRequest(_Strict):
    """Fields shared by chat and text completions."""

    model: str
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)  # default 1.0 as OpenAI; 0 = greedy
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)  # quickdraft extra (as vLLM): 0 or -1 disables
    seed: int | None = Field(None, ge=INT64_MIN, le=UINT64_MAX)
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    ignore_eos: bool = False  # quickdraft extra (as vLLM): keep generating past end-of-sequence
    quickdraft: QuickdraftOptions | None = None

    def stop_strings(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def unsupported(self) -> list[tuple[bool, str, str]]:
        """(is the value unsupported, param, message) for each OpenAI feature quickdraft lacks."""
        return [
            (
                self.n not in (None, 1),
                "n",
                "n must be 1: quickdraft returns one choice per request; send several requests instead",
            ),
            (bool(self.presence_penalty), "presence_penalty", "presence_penalty is not supported; omit it or send 0"),
            (
                bool(self.frequency_penalty),
                "frequency_penalty",
                "frequency_penalty is not supported; omit it or send 0",
            ),
            (bool(self.logit_bias), "logit_bias", "logit_bias is not supported; omit it"),
            (
                self.stream_options is not None and not self.stream,
                "stream_options",
                "stream_options is only allowed when stream is true",
            ),
            (len(self.stop_strings()) > MAX_STOP_STRINGS, "stop", f"stop takes at most {MAX_STOP_STRINGS} strings"),
            (not all(self.stop_strings()), "stop", "stop strings must not be empty"),
        ]


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None
    response_format: dict | None = None
    parallel_tool_calls: bool | None = None
    modalities: list[str] | None = None
    audio: dict | None = None

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def unsupported(self) -> list[tuple[bool, str, str]]:
        response_type = (self.response_format or {}).get("type", "text")
        return super().unsupported() + [
            (
                bool(self.logprobs) or bool(self.top_logprobs),
                "logprobs",
                "logprobs are not supported; omit logprobs and top_logprobs",
            ),
            (bool(self.tools), "tools", "tools are not supported; omit tools"),
            (
                self.tool_choice not in (None, "none", "auto"),
                "tool_choice",
                f"tool_choice {self.tool_choice!r} asks for a tool call, but quickdraft calls no tools; "
                "omit tool_choice or send 'none'",
            ),
            (
                response_type != "text",
                "response_format",
                f"response_format {response_type!r} is not supported; omit it",
            ),
            (
                self.modalities not in (None, ["text"]),
                "modalities",
                f"modalities {self.modalities!r} are not supported: quickdraft writes text only; "
                "omit modalities or send ['text']",
            ),
            (self.audio is not None, "audio", "audio output is not supported: quickdraft writes text only; omit audio"),
            *(problem for index, message in enumerate(self.messages) for problem in message.unsupported(index)),
        ]


class CompletionRequest(GenerationRequest):
    prompt: str | list[str] | list[int]
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None

    def unsupported(self) -> list[tuple[bool, str, str]]:
        return super().unsupported() + [
            (isinstance(self.prompt, list) and not self.prompt, "prompt", "prompt is empty; send some text"),
            (
                _is_text_batch(self.prompt),
                "prompt",
                "prompt must be one string or one list of token ids; send one request per prompt",
            ),
            (bool(self.echo), "echo", "echo is not supported; omit it"),
            (bool(self.suffix), "suffix", "suffix is not supported; omit it"),
            (self.best_of not in (None, 1), "best_of", "best_of must be 1"),
            (bool(self.logprobs), "logprobs", "logprobs are not supported; omit it"),
        ]


RequestT = TypeVar("RequestT", bound=GenerationRequest)


def _is_text_batch(prompt: str | list[str] | list[int]) -> bool:
    return isinstance(prompt, list) and len(prompt) > 1 and isinstance(prompt[0], str)


def parse_request(model: type[RequestT], body: bytes) -> RequestT:
    """Validate a JSON body; any problem becomes a 400 OpenAI error naming the parameter."""
    try:
        request = model.model_validate_json(body)
    except ValidationError as exc:
        raise _validation_error(exc, body) from None
    for is_unsupported, param, message in request.unsupported():
        if is_unsupported:
            raise invalid(message, param=param)
    return request


def _validation_error(exc: ValidationError, body: bytes) -> APIError:
    errors = exc.errors(include_url=False)
    if errors[0]["type"] == "json_invalid":
        return invalid(
            f"the request body is not valid JSON ({errors[0]['msg']}); send a JSON object", code="invalid_json"
        )
    error = max(errors, key=lambda e: len(e["loc"]))  # the deepest error is the most specific one
    param = _param(error, json.loads(body))
    where = f"invalid value for '{param}': " if param else "invalid request body: "
    return invalid(where + error["msg"], param=param)


def _param(error: dict, data: object) -> str | None:
    """Dotted path of the failing parameter, e.g. `messages[0].role`, skipping pydantic's union tags."""
    path = ""
    loc = error["loc"]
    for index, part in enumerate(loc):
        if isinstance(part, int) and isinstance(data, list) and part < len(data):
            path, data = f"{path}[{part}]", data[part]
        elif (
            isinstance(part, str)
            and isinstance(data, dict)
            and (part in data or (error["type"] == "missing" and index == len(loc) - 1))
        ):
            path, data = f"{path}.{part}" if path else part, data.get(part)
        else:
            break
    return path or None
