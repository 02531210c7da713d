"""The methods a benchmark compares, each behind one interface: `run(prompt_ids, params) -> Measurement`.

`QuickdraftMethod` runs the engine with a drafter and k (both passed through untouched, so new
drafters and k="auto" work as they land). `HFGenerate` runs transformers' own `generate` on the
same weights: plain greedy, prompt lookup (`prompt_lookup_num_tokens`) or an assistant model.
Wall time is the whole generation call, prefill included, for every method.
"""

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, Protocol

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedModel
from transformers.generation.streamers import BaseStreamer

from quickdraft.config import SamplingParams
from quickdraft.engine import Engine
from quickdraft.stats import acceptance_rate, tau

Family = Literal["quickdraft", "transformers"]
HFMode = Literal["greedy", "lookup", "assistant"]

AUTO = "auto"
JOINER = "+"  # bench drafters joined for --k auto to choose between, e.g. ngram+head


@dataclass(frozen=True)
class Measurement:
    """One generation by one method. A *step* is a target forward that yields `accepted + 1` tokens.

    For quickdraft the prefill is not a step; for transformers every target forward is one (its
    assisted loop verifies the first draft together with the prompt). Per-position counts exist
    only where the method exposes them (None otherwise).
    """

    token_ids: tuple[int, ...]  # output tokens, EOS excluded
    finish_reason: str  # "stop" (EOS) or "length"
    wall_seconds: float  # the whole generation call, prefill included
    time_to_first_token: float
    target_forwards: int  # every forward of the target, prefill included
    steps: int
    draft_tokens: int  # draft tokens the target verified
    accepted_tokens: int
    draft_seconds: float | None  # time spent drafting (None: not separable)
    verify_seconds: float  # target forwards of the steps (plus verification, for quickdraft)
    drafted_by_position: tuple[int, ...] | None = None  # [i]: steps that drafted a token at position i
    accepted_by_position: tuple[int, ...] | None = None  # [i]: steps that accepted the token at position i
    accepted_length_histogram: tuple[int, ...] | None = None  # [n]: steps that accepted exactly n tokens

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return tau(self.accepted_tokens, self.steps)

    @property
    def acceptance_rate(self) -> float | None:
        return acceptance_rate(self.accepted_tokens, self.draft_tokens)

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "new_tokens": self.new_tokens,
            "tokens_per_second": self.tokens_per_second,
            "mean_accepted_length": self.mean_accepted_length,
            "acceptance_rate": self.acceptance_rate,
        }


class Method(Protocol):
    """A way of generating that the benchmark times."""

    name: str  # unique label in reports, e.g. "qd:ngram k=4"
    family: Family
    drafter: str  # quickdraft drafter name, or the transformers mode
    k: int | str | None  # draft length setting (None where it does not apply)

    def run(self, prompt_ids: list[int], params: SamplingParams) -> Measurement:
        """Generate from `prompt_ids` and measure it."""


class QuickdraftMethod:
    """The quickdraft engine with one drafter and k."""

    family: Family = "quickdraft"

    def __init__(self, engine: Engine, drafter: str, k: int | str | None) -> None:
        self.engine = engine
        self.drafter = drafter
        self.k = k
        spec_drafter = engine_drafter(drafter)
        self.spec = engine.spec_with(drafter=spec_drafter) if k is None else engine.spec_with(drafter=spec_drafter, k=k)
        self.name = f"qd:{display_name(drafter)}" if k is None else f"qd:{display_name(drafter)} k={k}"

    def run(self, prompt_ids: list[int], params: SamplingParams) -> Measurement:
        started = time.perf_counter()
        result = self.engine.generate(prompt_ids, params, spec=self.spec)
        wall = time.perf_counter() - started
        stats = result.stats
        return Measurement(
            token_ids=tuple(result.token_ids),
            finish_reason=result.finish_reason,
            wall_seconds=wall,
            time_to_first_token=stats.prefill_seconds,
            target_forwards=stats.target_forwards,
            steps=stats.steps,
            draft_tokens=stats.draft_tokens,
            accepted_tokens=stats.accepted_tokens,
            draft_seconds=stats.draft_seconds,
            verify_seconds=stats.verify_seconds,
            drafted_by_position=tuple(stats.drafted_by_position),
            accepted_by_position=tuple(stats.accepted_by_position),
            accepted_length_histogram=tuple(stats.accepted_length_histogram),
        )


class HFTarget:
    """A transformers model with hooks that count and time its forwards (the peers' shared target)."""

    def __init__(self, model_dir: Path, dtype: str, eos_token_ids: frozenset[int]) -> None:
        self.model = load_hf_model(model_dir, dtype)
        self.eos_token_ids = sorted(eos_token_ids)
        self.forward_inputs: list[int] = []  # [forward]: input length of each target forward
        self.forward_seconds: list[float] = []  # [forward]: duration of each target forward
        self._started = 0.0
        self.model.register_forward_pre_hook(self._before_forward, with_kwargs=True)
        self.model.register_forward_hook(self._after_forward)

    def reset(self) -> None:
        self.forward_inputs.clear()
        self.forward_seconds.clear()

    def _before_forward(self, module, args, kwargs) -> None:
        input_ids = kwargs.get("input_ids", args[0] if args else None)  # [1, n]
        self.forward_inputs.append(int(input_ids.shape[-1]))
        self._started = time.perf_counter()

    def _after_forward(self, module, args, output) -> None:
        self.forward_seconds.append(time.perf_counter() - self._started)


class HFGenerate:
    """transformers' `generate` on the target's weights: plain, prompt lookup, or assisted by a draft."""

    family: Family = "transformers"

    def __init__(
        self,
        target: HFTarget,
        mode: HFMode,
        lookup_tokens: int = 4,
        assistant: PreTrainedModel | None = None,
        assistant_name: str = "",
    ) -> None:
        self.target = target
        self.drafter = mode
        self.lookup_tokens = lookup_tokens
        self.assistant = assistant
        self.k = lookup_tokens if mode == "lookup" else None
        self.name = {
            "greedy": "hf:greedy",
            "lookup": f"hf:lookup n={lookup_tokens}",
            "assistant": f"hf:assistant {display_name(assistant_name)}",
        }[mode]

    def run(self, prompt_ids: list[int], params: SamplingParams) -> Measurement:
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.target.model.device)  # [1, prompt]
        first_token = _FirstTokenClock()
        self.target.reset()
        if params.seed is not None:
            torch.manual_seed(params.seed)
        started = time.perf_counter()
        output = self.target.model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            generation_config=self._generation_config(params),
            assistant_model=self.assistant,
            streamer=first_token,
        )  # [1, prompt + new]
        wall = time.perf_counter() - started
        generated = output[0, len(prompt_ids) :].tolist()
        return self._measurement(generated, len(prompt_ids), wall, first_token.seconds_after(started))

    def _generation_config(self, params: SamplingParams) -> GenerationConfig:
        sampling = {} if params.greedy else dict(temperature=params.temperature, top_k=0, top_p=1.0)
        lookup = dict(prompt_lookup_num_tokens=self.lookup_tokens) if self.drafter == "lookup" else {}
        eos = self.target.eos_token_ids
        return GenerationConfig(
            max_new_tokens=params.max_new_tokens,
            do_sample=not params.greedy,
            eos_token_id=eos,
            pad_token_id=eos[0] if eos else None,
            **sampling,
            **lookup,
        )

    def _measurement(
        self, generated: list[int], prompt_length: int, wall: float, time_to_first_token: float
    ) -> Measurement:
        """Counts from the forward hooks: the first forward holds the prompt plus any first draft."""
        eos_at = next((i for i, token in enumerate(generated) if token in self.target.eos_token_ids), None)
        produced = len(generated) if eos_at is None else eos_at + 1  # tokens the steps yielded, EOS included
        inputs, seconds = self.target.forward_inputs, self.target.forward_seconds
        drafted = (inputs[0] - prompt_length) + sum(n - 1 for n in inputs[1:])
        return Measurement(
            token_ids=tuple(generated[:eos_at]),
            finish_reason="length" if eos_at is None else "stop",
            wall_seconds=wall,
            time_to_first_token=time_to_first_token,
            target_forwards=len(inputs),
            steps=len(inputs),
            draft_tokens=drafted,
            accepted_tokens=max(produced - len(inputs), 0),
            draft_seconds=None,
            verify_seconds=sum(seconds[1:]),
        )


class _FirstTokenClock(BaseStreamer):
    """A streamer that only notes when the first generated token arrives (the first `put` is the prompt)."""

    def __init__(self) -> None:
        self.puts = 0
        self.first_token_at: float | None = None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2 and self.first_token_at is None:
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter()

    def seconds_after(self, started: float) -> float:
        return (self.first_token_at or started) - started


def load_hf_model(model_dir: Path, dtype: str) -> PreTrainedModel:
    """A transformers model from a local directory, eval mode, in `dtype`."""
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), use_safetensors=True).eval()


def engine_drafter(drafter: str) -> str:
    """The SpecConfig drafter of a bench drafter: "ngram+head" (joined for auto) -> "ngram,head"."""
    return drafter.replace(JOINER, ",")


def display_name(drafter: str) -> str:
    """A drafter name as shown in tables: paths shortened to their last part, joined drafters kept joined."""
    return JOINER.join(Path(part).name if "/" in part else part for part in drafter.split(JOINER))
