"""From a validated request to what the engine runs: prompt ids, sampling parameters, speculation.

Every check that needs the model happens here, before a request is queued, so a bad request is
answered 400 at once and a stream never starts for a request the engine would refuse.
"""

import asyncio

from quickdraft.config import SamplingParams, SpecConfig, drafter_names
from quickdraft.drafters.registry import loads_model
from quickdraft.engine import Engine
from quickdraft.errors import UsageError
from quickdraft.server.errors import APIError, invalid
from quickdraft.server.schemas import ChatCompletionRequest, CompletionRequest, GenerationRequest
from quickdraft.server.settings import ServerSettings

DEFAULT_TEMPERATURE = 1.0  # as OpenAI; send temperature 0 for greedy decoding


def check_model(request: GenerationRequest, settings: ServerSettings) -> None:
    if request.model != settings.model_name:
        raise APIError(
            404,
            f"the model '{request.model}' does not exist here; "
            f"this server serves '{settings.model_name}' (see GET /v1/models)",
            param="model",
            code="model_not_found",
        )


async def chat_prompt_ids(engine: Engine, request: ChatCompletionRequest) -> list[int]:
    """The messages rendered through the model's chat template, as token ids."""
    if not engine.target.tokenizer.chat_template:
        raise invalid(
            f"model {engine.target.info.name} has no chat template; use /v1/completions with a plain prompt",
            param="messages",
        )
    messages = [{"role": _template_role(m.role), "content": m.text()} for m in request.messages]
    return await asyncio.to_thread(engine.encode, messages, True)


async def completion_prompt_ids(engine: Engine, request: CompletionRequest) -> list[int]:
    """The prompt text encoded without a template, or the prompt's own token ids (checked)."""
    prompt = request.prompt
    if isinstance(prompt, list) and isinstance(prompt[0], int):
        vocab_size = engine.target.info.vocab_size
        if not all(0 <= token < vocab_size for token in prompt):
            raise invalid(f"prompt token ids must be in [0, {vocab_size})", param="prompt")
        return list(prompt)
    text = prompt if isinstance(prompt, str) else prompt[0]
    if not text.strip():
        raise invalid("prompt is empty; send some text to continue", param="prompt")
    return await asyncio.to_thread(engine.encode, text, False)


def output_budget(request: GenerationRequest, prompt_tokens: int, context: int, default: int) -> int:
    """max_new_tokens: what the request asked for, else `default` capped by the context.

    Raises 400 context_length_exceeded, naming the prompt when it alone fills the context, else max_tokens.
    """
    requested = request.requested_max_tokens()
    budget = max(requested if requested is not None else min(default, context - prompt_tokens), 1)
    if prompt_tokens + budget > context:
        prompt_param = "messages" if isinstance(request, ChatCompletionRequest) else "prompt"
        raise invalid(
            f"this model's maximum context length is {context} tokens, but {prompt_tokens + budget} were requested "
            f"({prompt_tokens} in the prompt, {budget} for the completion); shorten the prompt or lower max_tokens",
            param=prompt_param if prompt_tokens >= context else "max_tokens",
            code="context_length_exceeded",
        )
    return budget


def sampling_params(request: GenerationRequest, max_new_tokens: int) -> SamplingParams:
    return SamplingParams(
        temperature=DEFAULT_TEMPERATURE if request.temperature is None else request.temperature,
        top_k=max(request.top_k or 0, 0),
        top_p=1.0 if request.top_p is None else request.top_p,
        seed=request.seed,
        max_new_tokens=max_new_tokens,
        stop=request.stop_strings(),
        ignore_eos=request.ignore_eos,
    )


def spec_config(request: GenerationRequest, engine: Engine) -> SpecConfig:
    """The engine's speculation config with the request's `quickdraft` overrides (a fixed k alone, on a server
    drafting with several drafters under auto, keeps the first of them)."""
    options = request.quickdraft
    if options is None:
        return engine.spec
    if options.drafter is not None and not _may_request(options.drafter, engine):
        raise invalid(
            "quickdraft.drafter must be one of none, ngram, ngram:MAX, ngram:MIN-MAX or this server's "
            f"{engine.spec.drafter}, got {options.drafter!r}",
            param="quickdraft.drafter",
        )
    drafter = options.drafter
    if drafter is None and isinstance(options.k, int) and len(engine.spec.drafters) > 1:
        drafter = engine.spec.drafters[0]  # a fixed k drives one drafter: the first of the server's (ngram by default)
    changes = {"drafter": drafter, "k": options.k}
    spec = engine.spec_with(**{name: value for name, value in changes.items() if value is not None})
    for name in spec.drafters:
        try:
            engine.drafter(name)  # a kind that loads nothing is built at once, so bad options are a 400 here
        except UsageError as exc:
            raise invalid(str(exc), param="quickdraft.drafter") from exc
    return spec


def _may_request(drafter: str, engine: Engine) -> bool:
    """The server's own drafters, or kinds that load nothing: request content never names a file or a model."""
    return drafter == engine.spec.drafter or all(name and not loads_model(name) for name in drafter_names(drafter))


def _template_role(role: str) -> str:
    return "system" if role == "developer" else role
