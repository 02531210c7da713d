"""The speculative decoding loop and the Python API.

    engine = Engine.from_names("smollm2-135m-instruct", drafter="ngram", k=4)
    result = engine.generate("Tell me a story", SamplingParams(max_new_tokens=64), chat=True)
    print(result.text, result.stats.mean_accepted_length)
    for event in engine.stream("Hello", SamplingParams(temperature=0.7, seed=1)):
        ...  # TextDelta events, then one Finished event

One step: the controller chooses a drafter and k (fixed, or per step under k="auto", see
`controller.py`); the drafter proposes k tokens; the target runs one forward over the pending
token plus the draft; the verifier keeps a prefix of the draft and adds one target token; the
caches are rolled back to the committed length; the controller learns from the outcome. The
target cache always holds every committed token except the newest one (the *pending* token),
which is fed with the next draft.
"""

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Literal

import torch

from quickdraft import sampling
from quickdraft.config import DEFAULT_MODEL, EngineConfig, SamplingParams, SpecConfig
from quickdraft.controller import AdaptiveController, Controller, ControllerMemory, FixedController, Plan
from quickdraft.costs import calibrate_drafter, calibrate_target
from quickdraft.drafters.base import Draft, Drafter, DrafterLoadOptions
from quickdraft.drafters.defaults import default_drafter
from quickdraft.drafters.registry import check_name, make_drafter
from quickdraft.errors import UsageError
from quickdraft.models.base import ModelRunner
from quickdraft.models.loading import LoadedModel, load_model
from quickdraft.stats import GenerationStats
from quickdraft.text import IncrementalDetokenizer, Messages, StopMatcher, encode_prompt
from quickdraft.verify import Verdict, greedy_verify, rejection_sample

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class TextDelta:
    """Output of one step: new text, safe to show (never part of a stop string).

    One is yielded after every step, even when the text is empty (held back as a possible stop
    string or an incomplete character), so a consumer can cancel within one step.
    """

    text: str


@dataclass(frozen=True)
class Finished:
    """The last event of a stream."""

    text: str  # the whole output text
    token_ids: tuple[int, ...]  # the output tokens (EOS excluded)
    finish_reason: FinishReason  # "stop": EOS or a stop string; "length": max_new_tokens or context full
    stats: GenerationStats


Event = TextDelta | Finished


class Engine:
    """A target model, its drafters, and the loop that runs them."""

    def __init__(
        self,
        target: LoadedModel,
        spec: SpecConfig = SpecConfig(),
        drafter_options: DrafterLoadOptions = DrafterLoadOptions(),
        *,
        costs: ControllerMemory | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """`costs`: the controller's cost model and acceptance to start from (None: calibrated before the first
        k="auto" request). `clock`: seconds for stats and the controller; a replay passes a clock that its
        stand-in target advances by modelled step times (`bench/replay.py`)."""
        self.target = target
        self.spec = spec
        self.drafter_options = drafter_options
        self._drafters: dict[str, Drafter] = {}
        self._memory = costs  # measured costs and acceptance, shared by requests
        self._clock = clock

    @classmethod
    def from_names(
        cls,
        model: str = DEFAULT_MODEL,
        drafter: str | None = None,
        k: int | Literal["auto"] = "auto",
        k_max: int = 8,
        runtime: str = "auto",
        dtype: str = "auto",
        device: str = "cpu",
        threads: int | None = None,
    ) -> "Engine":
        """`Engine.load` with the config given field by field."""
        config = EngineConfig(model=model, runtime=runtime, dtype=dtype, device=device, threads=threads)
        return cls.load(config, drafter, k, k_max)

    @classmethod
    def load(
        cls, config: EngineConfig, drafter: str | None = None, k: int | Literal["auto"] = "auto", k_max: int = 8
    ) -> "Engine":
        """Load the target `config` names, prepare the drafters (see `SpecConfig`; None: `default_drafter` for
        the target), and calibrate costs for k="auto"."""
        spec = SpecConfig(drafter=drafter or "ngram", k=k, k_max=k_max)  # checked before the slow load
        for name in spec.drafters:
            check_name(name)
        if config.threads:
            torch.set_num_threads(config.threads)
        target = load_model(config.model, runtime=config.runtime, dtype=config.dtype, device=config.device)
        if drafter is None:
            spec = replace(spec, drafter=default_drafter(target, k))
        engine = cls(target, spec, DrafterLoadOptions(runtime=config.runtime, dtype=config.dtype, device=config.device))
        for name in spec.drafters:
            engine.drafter(name)
        if spec.adaptive:
            engine.calibrate()
        return engine

    def drafter(self, name: str) -> Drafter:
        """The drafter called `name`, built on first use and kept for later requests."""
        if name not in self._drafters:
            self._drafters[name] = make_drafter(name, self.target, self.drafter_options)
        return self._drafters[name]

    def add_drafter(self, name: str, drafter: Drafter) -> None:
        """Use `drafter` for the name `name` in SpecConfig.drafter (e.g. a draft model loaded by the caller)."""
        self._drafters[name] = drafter

    def calibrate(self, spec: SpecConfig | None = None) -> ControllerMemory:
        """Measure, once per engine, the target's step time over 1..k_max+1 tokens and each model drafter's
        time per token.

        Done before the first k="auto" request (the target's cache is reset by every prefill);
        the result is refined by every later step.
        """
        spec = spec or self.spec
        if self._memory is None or self._memory.target.max_tokens < spec.k_max + 1:
            self._memory = ControllerMemory(calibrate_target(self.target.runner, spec.k_max + 1))
        for name, drafter in self._candidates(spec).items():
            if not drafter.lookup_only and name not in self._memory.draft_costs:
                self._memory.add_draft_cost(name, calibrate_drafter(drafter, self.target.runner))
        return self._memory

    def encode(self, prompt: str | Messages, chat: bool = False) -> list[int]:
        return encode_prompt(self.target.tokenizer, prompt, chat, self.target.info.name)

    def generate(
        self,
        prompt: str | Messages | list[int],
        params: SamplingParams = SamplingParams(),
        *,
        chat: bool = False,
        spec: SpecConfig | None = None,
    ) -> Finished:
        """Run to completion; returns the `Finished` event (text, tokens, finish reason, stats)."""
        for event in self.stream(prompt, params, chat=chat, spec=spec):
            if isinstance(event, Finished):
                return event
        raise AssertionError("stream ended without a Finished event")

    def stream(
        self,
        prompt: str | Messages | list[int],
        params: SamplingParams = SamplingParams(),
        *,
        chat: bool = False,
        spec: SpecConfig | None = None,
    ) -> Iterator[Event]:
        """Yield `TextDelta` events as text is committed, then one `Finished` event.

        `prompt` is text (rendered through the chat template when `chat`), chat messages, or
        token ids. Closing the iterator early stops generation after the current step.
        """
        prompt_ids = list(prompt) if _is_token_ids(prompt) else self.encode(prompt, chat)
        self._check_fits(prompt_ids)
        return self._run(prompt_ids, params, spec or self.spec)

    def spec_with(self, **changes) -> SpecConfig:
        """This engine's default SpecConfig with some fields replaced (validated)."""
        return replace(self.spec, **changes)

    def _check_fits(self, prompt_ids: list[int]) -> None:
        limit = self.target.info.max_context
        if not prompt_ids:
            raise UsageError("the prompt is empty; pass some text to continue")
        if len(prompt_ids) >= limit:
            raise UsageError(
                f"the prompt has {len(prompt_ids)} tokens but the model's context is {limit}; shorten the prompt"
            )

    def _candidates(self, spec: SpecConfig) -> dict[str, Drafter]:
        """The drafters a request may draft with, by name ("none" drafts nothing)."""
        return {name: self.drafter(name) for name in spec.drafters if name != "none"}

    def _controller(self, spec: SpecConfig) -> Controller:
        if not spec.adaptive:
            return FixedController(spec.drafter, spec.k)
        candidates = self._candidates(spec)
        if not candidates:
            return FixedController("none", 0)
        return AdaptiveController(candidates, self.calibrate(spec), spec.k_max)

    def _run(self, prompt_ids: list[int], params: SamplingParams, spec: SpecConfig) -> Iterator[Event]:
        runner = self.target.runner
        budget = min(params.max_new_tokens, runner.info.max_context - len(prompt_ids))
        request = _Request(self.target, prompt_ids, params, budget)
        stats = GenerationStats(prompt_tokens=len(prompt_ids))
        generator = sampling.make_generator(params.seed, runner.device)
        controller = self._controller(spec)
        for name in spec.drafters:
            self.drafter(name).begin(prompt_ids, params, generator)
        started = self._clock()
        hidden_readers = [d for d in self._candidates(spec).values() if d.needs_target_hidden]
        first = sampling.choose(_prefill(runner, prompt_ids, hidden_readers)[None], params, generator)  # [1]
        stats.target_forwards = 1
        request.commit((int(first),))
        stats.prefill_seconds = self._clock() - started
        yield from request.deltas()
        while not request.finish_reason:
            self._step(request, controller, hidden_readers, generator, stats)
            yield from request.deltas()
        controller.finish()
        stats.generated_tokens = len(request.generated)
        stats.total_seconds = self._clock() - started
        yield Finished(request.visible_text(), tuple(request.generated), request.finish_reason, stats)

    def _step(
        self,
        request: "_Request",
        controller: Controller,
        hidden_readers: list[Drafter],
        generator: torch.Generator,
        stats: GenerationStats,
    ) -> None:
        runner = self.target.runner
        started = self._clock()
        plan = controller.plan(request.context, request.remaining - 1)
        planned = self._clock()
        draft = self._draft(plan, request.context)
        drafted = self._clock()
        committed_length = runner.cache_length
        logits, hidden = _forward(
            runner, [request.pending, *draft.token_ids], hidden_readers
        )  # [len(draft) + 1, vocab]
        verdict = _verify(draft, logits, request.params, generator)
        runner.rollback(committed_length + 1 + verdict.num_accepted)
        verified = self._clock()
        controller.observe(plan, draft, verdict, drafted - planned, verified - drafted)
        for reader in hidden_readers:
            reader.observe_target(hidden[: verdict.num_accepted + 1])  # states of the committed positions
        stats.draft_seconds += drafted - started
        stats.verify_seconds += verified - drafted
        stats.record_step(len(draft), verdict.num_accepted, plan.drafter or "none")
        request.commit(verdict.tokens)

    def _draft(self, plan: Plan, context: list[int]) -> Draft:
        """The plan's k tokens: cut from a lookup already made, or proposed now."""
        if plan.k == 0 or plan.drafter is None:
            return Draft(token_ids=())
        if plan.drafter in plan.lookups:
            return plan.lookups[plan.drafter].truncated(plan.k)
        return self.drafter(plan.drafter).propose(context, plan.k)


def _prefill(runner: ModelRunner, prompt_ids: list[int], hidden_readers: list[Drafter]) -> torch.Tensor:
    """The prompt's last logits [vocab]; drafters that read target states get the prompt's."""
    if not hidden_readers:
        return runner.prefill(prompt_ids)
    logits, hidden = runner.prefill(prompt_ids, return_hidden=True)  # [vocab], [prompt, hidden]
    for reader in hidden_readers:
        reader.observe_target(hidden)
    return logits


def _forward(
    runner: ModelRunner, token_ids: list[int], hidden_readers: list[Drafter]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Logits [n, vocab], plus the states [n, hidden] when a drafter reads them (else None)."""
    if not hidden_readers:
        return runner.forward(token_ids), None
    return runner.forward(token_ids, return_hidden=True)


def _verify(draft: Draft, target_logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> Verdict:
    draft_ids = torch.tensor(draft.token_ids, dtype=torch.long, device=target_logits.device)  # [k]
    if params.greedy:
        return greedy_verify(draft_ids, target_logits)
    return rejection_sample(draft_ids, draft.probs, sampling.warp(target_logits, params), generator)


def _is_token_ids(prompt: object) -> bool:
    return isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) and bool(prompt)


class _Request:
    """Committed output of one request: tokens, text, stop handling, what has been streamed."""

    def __init__(self, target: LoadedModel, prompt_ids: list[int], params: SamplingParams, budget: int) -> None:
        self.prompt_ids = prompt_ids
        self.params = params
        self.budget = budget  # most tokens this request may generate (max_new_tokens and context)
        self.generated: list[int] = []
        self.finish_reason: FinishReason | None = None
        self._eos = frozenset() if params.ignore_eos else target.info.eos_token_ids
        self._detokenizer = IncrementalDetokenizer(target.tokenizer)
        self._stop = StopMatcher(params.stop)
        self._text_end: int | None = None  # set when a stop string cuts the text
        self._streamed = 0  # characters already handed out as deltas

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.generated

    @property
    def pending(self) -> int:
        return self.generated[-1]

    @property
    def remaining(self) -> int:
        return self.budget - len(self.generated)

    def commit(self, tokens: tuple[int, ...]) -> None:
        """Append tokens one by one until EOS, a stop string or the budget ends the request."""
        for token in tokens:
            if token in self._eos:
                self.finish_reason = "stop"
                return
            self.generated.append(token)
            new_from = len(self._detokenizer.text)
            self._detokenizer.add(token)
            stop_at = self._stop.find(self._detokenizer.text, new_from)
            if stop_at is not None:
                self._text_end = stop_at
                self.finish_reason = "stop"
                return
            if self.remaining == 0:
                self.finish_reason = "length"
                return

    def visible_text(self) -> str:
        return self._detokenizer.text[: self._text_end]

    def deltas(self) -> Iterator[TextDelta]:
        """The step's delta; at the end only if text is left, so every delta precedes `Finished`."""
        text = self.visible_text()
        end = len(text) if self.finish_reason else self._stop.safe_length(text)
        if end > self._streamed or not self.finish_reason:
            yield TextDelta(text[self._streamed : end])
            self._streamed = max(end, self._streamed)
