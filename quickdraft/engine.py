"""The speculative decoding loop over many requests at once, and the Python API.

    engine = Engine.from_names("smollm2-135m-instruct", drafter="ngram", k=4)
    result = engine.generate("Tell me a story", SamplingParams(max_new_tokens=64), chat=True)
    print(result.text, result.stats.mean_accepted_length)
    for event in engine.stream("Hello", SamplingParams(temperature=0.7, seed=1)):
        ...  # TextDelta events, then one Finished event
    for index, event in engine.stream_many(["Hi", "Hello"], SamplingParams()):
        ...  # both run in one batch; each one's events in order

One step serves every running request (`step`). Waiting requests are admitted while KV cache slots
are free (at most `max_batch` run). Each running request either reads the next chunk of its prompt
(prefills share a budget of `step_tokens` per step, shortest remaining prompt first, so a new arrival
gets its first token within a bounded time while running streams keep flowing) or decodes: its
controller chooses a drafter and k (fixed, or per step under k="auto", priced against the rest of
the batch, see `controller.py`), the drafter proposes, and the pending token plus the draft join the
batch. One target forward runs over all of it; each request then verifies its own rows, keeps a
prefix of its draft plus one target token, and rolls its slot back to the committed length. A
request's slot always holds every committed token except the newest one (the *pending* token), which
is fed with the next draft.

Nothing of one request flows into another: each has its own drafter instances, controller, sampler
and generator (`running.py`), and the target's batched rows are bit-identical to the rows the same
tokens give alone (`models/base.py`), so a request's output does not depend on what else runs.
"""

import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Literal

import torch

from quickdraft.config import DEFAULT_MODEL, DEFAULT_STEP_TOKENS, EngineConfig, SamplingParams, SpecConfig
from quickdraft.controller import AdaptiveController, BatchLoad, Controller, ControllerMemory, FixedController
from quickdraft.costs import calibrate_drafter, calibrate_target
from quickdraft.drafters.base import Drafter, DrafterLoadOptions
from quickdraft.drafters.registry import check_name, make_drafter
from quickdraft.errors import UsageError
from quickdraft.models.base import SequenceOutput, SequenceStep, synchronize
from quickdraft.models.loading import LoadedModel, load_model
from quickdraft.models.native.kernels import argmax_each
from quickdraft.models.registry import default_drafter
from quickdraft.models.single_slot import batch_view
from quickdraft.output import Event, Failed, Finished, RequestOutput, TextDelta
from quickdraft.running import DecodePlan, RunningRequest
from quickdraft.text import Messages, encode_prompt

__all__ = ["Engine", "Event", "Failed", "Finished", "TextDelta"]


class Engine:
    """A target model, its drafters, and the loop that runs many requests over them."""

    def __init__(
        self,
        target: LoadedModel,
        spec: SpecConfig = SpecConfig(),
        drafter_options: DrafterLoadOptions = DrafterLoadOptions(),
        *,
        max_batch: int = 1,
        step_tokens: int = DEFAULT_STEP_TOKENS,
        costs: ControllerMemory | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """`max_batch`: most requests running at once (a runner that holds one sequence runs one).
        `step_tokens`: prompt tokens prefilled per step. `costs`: the controller's cost model and acceptance
        to start from (None: calibrated before the first k="auto" request). `clock`: seconds for stats and the
        controller; a replay passes a clock that its stand-in target advances by modelled step times
        (`bench/replay.py`)."""
        if max_batch < 1 or step_tokens < 1:
            raise UsageError(f"max_batch and step_tokens must be >= 1, got {max_batch} and {step_tokens}")
        self.target = target
        self.spec = spec
        self.drafter_options = drafter_options
        self._batch, slot_limit = batch_view(target.runner)
        self.max_batch = min(max_batch, slot_limit or max_batch)
        self.step_tokens = step_tokens
        self._drafters: dict[str, Drafter] = {}
        self._memory = costs  # measured costs and acceptance, shared by requests
        self._clock = clock
        self._waiting: deque[tuple[int, list[int], SamplingParams, SpecConfig, float]] = deque()
        self._running: list[RunningRequest] = []
        self._finished_events: list[tuple[int, Event]] = []  # of requests that left the batch this step
        self.last_step: tuple[int, int] | None = None  # (sequences, rows) of the latest step's target forward
        self._next_id = 0

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
        max_batch: int = 1,
        step_tokens: int = DEFAULT_STEP_TOKENS,
    ) -> "Engine":
        """`Engine.load` with the config given field by field."""
        config = EngineConfig(model=model, runtime=runtime, dtype=dtype, device=device, threads=threads)
        return cls.load(config, drafter, k, k_max, max_batch, step_tokens)

    @classmethod
    def load(
        cls,
        config: EngineConfig,
        drafter: str | None = None,
        k: int | Literal["auto"] = "auto",
        k_max: int = 8,
        max_batch: int = 1,
        step_tokens: int = DEFAULT_STEP_TOKENS,
    ) -> "Engine":
        """Load the target `config` names, prepare the drafters (see `SpecConfig`; None: the target's own,
        `default_drafter`), and calibrate costs for k="auto"."""
        spec = SpecConfig(drafter=drafter or default_drafter(config.model), k=k, k_max=k_max)  # checked before loading
        for name in spec.drafters:
            check_name(name)
        if config.threads:
            torch.set_num_threads(config.threads)
        target = load_model(config.model, runtime=config.runtime, dtype=config.dtype, device=config.device)
        options = DrafterLoadOptions(runtime=config.runtime, dtype=config.dtype, device=config.device)
        engine = cls(target, spec, options, max_batch=max_batch, step_tokens=step_tokens)
        for name in spec.drafters:
            engine.drafter(name)
        if spec.adaptive:
            engine.calibrate()
        return engine

    def drafter(self, name: str) -> Drafter:
        """The drafter called `name`, built on first use and kept for later requests (each request drafts with
        its own `fork` of it)."""
        if name not in self._drafters:
            self._drafters[name] = make_drafter(name, self.target, self.drafter_options)
        return self._drafters[name]

    def add_drafter(self, name: str, drafter: Drafter) -> None:
        """Use `drafter` for the name `name` in SpecConfig.drafter (e.g. a draft model loaded by the caller)."""
        self._drafters[name] = drafter

    def calibrate(self, spec: SpecConfig | None = None) -> ControllerMemory:
        """Measure, once per engine, the target's step time over 1..k_max+1 tokens (for a batch, up to
        max_batch times that many rows) and each model drafter's time per token.

        Done before the first k="auto" request, on the target's own batch-1 slot; the result is refined by
        every later step.
        """
        spec = spec or self.spec
        if self._memory is None or self._memory.target.max_tokens < (spec.k_max + 1) * self.max_batch:
            target = calibrate_target(self.target.runner, spec.k_max + 1, self.max_batch)
            if self._memory is None:
                self._memory = ControllerMemory(target)
            self._memory.target = target
        for name, drafter in self._candidates(spec).items():
            if not drafter.lookup_only and name not in self._memory.draft_costs:
                self._memory.add_draft_cost(name, calibrate_drafter(drafter, self.target.runner))
        return self._memory

    def encode(self, prompt: str | Messages, chat: bool = False) -> list[int]:
        return encode_prompt(self.target.tokenizer, prompt, chat, self.target.info.name)

    def kv_bytes_per_slot(self) -> int:
        """KV cache bytes a running request may take at the full context (0: the runner reserves nothing)."""
        return self._batch.slot_bytes()

    def spec_with(self, **changes) -> SpecConfig:
        """This engine's default SpecConfig with some fields replaced (validated)."""
        return replace(self.spec, **changes)

    # --- one request at a time ---

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
        token ids. Closing the iterator early stops generation after the current step. The engine
        must be idle (use `stream_many`, or `submit` and `step`, for several requests at once).
        """
        if self.busy:
            raise UsageError("the engine is running other requests; use stream_many, or submit and step")
        request_id = self.submit(prompt, params, chat=chat, spec=spec)
        for _, event in self._drain({request_id}):
            if isinstance(event, Failed):
                raise event.error
            yield event

    # --- many requests at once ---

    def stream_many(
        self,
        prompts: Sequence[str | Messages | list[int]],
        params: SamplingParams | Sequence[SamplingParams] = SamplingParams(),
        *,
        chat: bool = False,
        spec: SpecConfig | None = None,
    ) -> Iterator[tuple[int, Event]]:
        """Run every prompt in one batch (at most `max_batch` at a time, the rest waiting); yield (index of the
        prompt, event) as steps produce them. `params`: one for all, or one per prompt. Each prompt's events
        come in order and end with `Finished` (or `Failed`). Closing the iterator early cancels what has not
        finished."""
        if self.busy:
            raise UsageError("the engine is running other requests; submit and step instead")
        per_prompt = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(per_prompt) != len(prompts):
            raise UsageError(f"{len(prompts)} prompts but {len(per_prompt)} sampling params; pass one or one each")
        ids = [self.submit(prompt, p, chat=chat, spec=spec) for prompt, p in zip(prompts, per_prompt)]
        index = {request_id: i for i, request_id in enumerate(ids)}
        return ((index[request_id], event) for request_id, event in self._drain(set(ids)))

    def submit(
        self,
        prompt: str | Messages | list[int],
        params: SamplingParams = SamplingParams(),
        *,
        chat: bool = False,
        spec: SpecConfig | None = None,
    ) -> int:
        """Queue a request (checked now: a prompt that does not fit raises `UsageError`); its id for `step`'s
        events and `cancel`."""
        prompt_ids = list(prompt) if _is_token_ids(prompt) else self.encode(prompt, chat)
        self._check_fits(prompt_ids)
        request_id, self._next_id = self._next_id, self._next_id + 1
        self._waiting.append((request_id, prompt_ids, params, spec or self.spec, self._clock()))
        return request_id

    def cancel(self, request_id: int) -> None:
        """Forget a request, waiting or running (a no-op once it has finished): the others lose nothing."""
        self._waiting = deque(w for w in self._waiting if w[0] != request_id)
        for request in [r for r in self._running if r.request_id == request_id]:
            self._release(request)

    @property
    def busy(self) -> bool:
        """True while any request waits or runs."""
        return bool(self._waiting or self._running)

    @property
    def request_counts(self) -> tuple[int, int]:
        """(running, waiting) requests."""
        return len(self._running), len(self._waiting)

    def step(self) -> list[tuple[int, Event]]:
        """Admit waiting requests into free slots, run one step for every running one; the (request id, event)
        pairs it produced, in order. A request's last event is `Finished`, or `Failed` when its drafter or
        the forward raised (the other requests go on)."""
        self._admit()
        self.last_step = None
        if not self._running:
            return self._collect()
        prefills, decodes = self._parts()
        parts = [part for _, part in prefills] + [request.decode_part(plan) for request, plan in decodes]
        committed = {request.request_id: self._batch.slot_length(request.slot) for request, _ in decodes}
        started = self._clock()
        try:
            outputs = self._batch.forward_batch(parts)
            synchronize(self.target.runner.device)  # a GPU computes after the call returns: time the work itself
        except Exception as error:  # the batch is lost; every request in it fails, the engine goes on
            for request in [r for r, _ in prefills] + [r for r, _ in decodes]:
                self._fail(request, error)
            return self._collect()
        seconds = self._clock() - started
        self.last_step = (len(parts), sum(len(p.token_ids) for p in parts))
        if self._memory is not None:
            self._memory.target.observe(self.last_step[1], seconds, len(parts))
        for (request, part), out in zip(prefills, outputs):
            self._guarded(request, lambda r=request, p=part, o=out: r.take_prefill(p, o))
        verified = list(zip(decodes, outputs[len(prefills) :]))
        greedy_ids = iter(argmax_each([out.logits for (request, _), out in verified if request.params.greedy]))
        for (request, plan), out in verified:
            request.stats.verify_seconds += seconds
            ids = next(greedy_ids) if request.params.greedy else None
            self._guarded(request, lambda r=request, p=plan, o=out, i=ids: self._verified(r, p, o, i, committed))
        return self._collect()

    # --- the step's parts ---

    def _admit(self) -> None:
        while self._waiting and len(self._running) < self.max_batch:
            request_id, prompt_ids, params, spec, submitted = self._waiting.popleft()
            try:
                request = self._start(request_id, prompt_ids, params, spec, submitted)
            except Exception as error:
                self._finished_events.append((request_id, Failed(error)))
                continue
            request.slot = self._batch.open_slot()
            self._running.append(request)

    def _start(
        self, request_id: int, prompt_ids: list[int], params: SamplingParams, spec: SpecConfig, submitted: float
    ) -> RunningRequest:
        runner = self.target.runner
        budget = min(params.max_new_tokens, runner.info.max_context - len(prompt_ids))
        output = RequestOutput(self.target.tokenizer, self.target.info.eos_token_ids, prompt_ids, params, budget)
        drafters = {name: self.drafter(name).fork() for name in spec.drafters}
        controller = self._controller(spec, drafters)
        return RunningRequest(request_id, output, params, drafters, controller, self._clock, submitted, runner.device)

    def _parts(self) -> tuple[list[tuple[RunningRequest, SequenceStep]], list[tuple[RunningRequest, DecodePlan]]]:
        """This step's prompt chunks within `step_tokens`, shortest remaining prompt first (with aging, see
        `RunningRequest.prefill_rank`; ties in admission order), and each decoding request's plan, priced
        against the rest of the batch."""
        budget, prefills = self.step_tokens, []
        prefilling = sorted((r for r in self._running if r.prefilling), key=lambda r: r.prefill_rank(budget))
        for request in prefilling:
            request.prefill_steps += 1
            if budget > 0:
                part = request.prefill_part(budget)
                budget -= len(part.token_ids)
                prefills.append((request, part))
        decoding = [r for r in self._running if not r.prefilling and not r.done]
        prompt_rows = sum(len(part.token_ids) for _, part in prefills)
        rows, sequences, tokens = prompt_rows + len(decoding), len(prefills) + len(decoding), float(len(decoding))
        decodes = []
        for request in decoding:
            load = BatchLoad(
                rows=rows - 1,
                sequences=sequences - 1,
                tokens=tokens - 1,
                prompt_rows=prompt_rows,
                prompt_sequences=len(prefills),
                prefilling=len(prefilling),
            )
            plan = self._guarded(request, lambda r=request, lo=load: r.plan(lo))
            if plan is None:
                continue
            rows += len(plan.draft)
            tokens += plan.plan.tokens - 1
            decodes.append((request, plan))
        return prefills, decodes

    def _verified(
        self,
        request: RunningRequest,
        plan: DecodePlan,
        out: SequenceOutput,
        greedy_ids: list[int] | None,
        committed: dict[int, int],
    ) -> None:
        keep = request.take_verification(plan, out, committed[request.request_id], greedy_ids)
        self._batch.rollback_slot(request.slot, keep)

    def _guarded(self, request: RunningRequest, action: Callable[[], object]):
        """action()'s result, or None when it raised: then the request fails and leaves the batch."""
        try:
            return action()
        except Exception as error:
            self._fail(request, error)
            return None

    def _fail(self, request: RunningRequest, error: Exception) -> None:
        request.fail(error)
        self._release(request, keep_events=True)

    def _collect(self) -> list[tuple[int, Event]]:
        """Finish the requests that are done; every event of this step, in order."""
        for request in [r for r in self._running if r.done]:
            request.finish()
            self._release(request, keep_events=True)
        events, self._finished_events = self._finished_events, []
        for request in self._running:
            events.extend((request.request_id, event) for event in request.events)
            request.events.clear()
        return events

    def _release(self, request: RunningRequest, keep_events: bool = False) -> None:
        """Take a request out of the batch: its slot and its drafters' state go back."""
        self._running.remove(request)
        self._batch.close_slot(request.slot)
        for drafter in request.drafters.values():
            drafter.finish()
        if keep_events:
            self._finished_events.extend((request.request_id, event) for event in request.events)

    def _drain(self, request_ids: set[int]) -> Iterator[tuple[int, Event]]:
        """Step until every request of `request_ids` has ended; cancel the rest if the consumer stops early."""
        open_ids = set(request_ids)
        try:
            while open_ids:
                for request_id, event in self.step():
                    yield request_id, event
                    if isinstance(event, Finished | Failed):
                        open_ids.discard(request_id)
        finally:
            for request_id in open_ids:
                self.cancel(request_id)

    def _check_fits(self, prompt_ids: list[int]) -> None:
        limit = self.target.info.max_context
        if not prompt_ids:
            raise UsageError("the prompt is empty; pass some text to continue")
        if len(prompt_ids) >= limit:
            raise UsageError(
                f"the prompt has {len(prompt_ids)} tokens but the model's context is {limit}; shorten the prompt"
            )

    def _candidates(self, spec: SpecConfig) -> dict[str, Drafter]:
        """The engine's drafters a request may draft with, by name ("none" drafts nothing)."""
        return {name: self.drafter(name) for name in spec.drafters if name != "none"}

    def _controller(self, spec: SpecConfig, drafters: dict[str, Drafter]) -> Controller:
        if not spec.adaptive:
            return FixedController(spec.drafter, spec.k)
        candidates = {name: drafter for name, drafter in drafters.items() if name != "none"}
        if not candidates:
            return FixedController("none", 0)
        return AdaptiveController(candidates, self.calibrate(spec), spec.k_max)


def _is_token_ids(prompt: object) -> bool:
    return isinstance(prompt, list) and all(isinstance(t, int) for t in prompt) and bool(prompt)
