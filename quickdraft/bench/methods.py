"""The methods a benchmark compares, each behind one interface: `run(prompt_ids, params) -> Generation`.

`QuickdraftMethod` runs the engine with a drafter and k (both passed through untouched, so new
drafters and k="auto" work as they land). `HFGenerate` runs transformers' own `generate` on the
same weights: plain greedy, prompt lookup (`prompt_lookup_num_tokens`) or an assistant model.
`LlamaCppGenerate` asks a llama-server (`bench/llama_cpp.LlamaServer`) on the model's GGUF file, plain or
with its n-gram speculation. Wall time is the whole generation call, prefill included, for every method
(for llama.cpp the HTTP request on the local machine, prompt cache off).
"""

import time
from pathlib import Path
from typing import Literal, Protocol

import torch
from transformers import AutoModelForCausalLM, GenerationConfig, PreTrainedModel
from transformers.generation.streamers import BaseStreamer

from quickdraft.bench.llama_cpp import LlamaServer
from quickdraft.config import SamplingParams
from quickdraft.engine import Engine
from quickdraft.measure import Generation, measure
from quickdraft.models.base import synchronize

Family = Literal["quickdraft", "transformers", "llama.cpp"]
HFMode = Literal["greedy", "lookup", "assistant"]

AUTO = "auto"
JOINER = "+"  # bench drafters joined for --k auto to choose between, e.g. ngram+head


class Method(Protocol):
    """A way of generating that the benchmark times."""

    name: str  # unique label in reports, e.g. "qd:ngram k=4"
    family: Family
    drafter: str  # quickdraft drafter name, or the transformers mode
    k: int | str | None  # draft length setting (None where it does not apply)

    def run(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
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

    def run(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        return measure(self.engine, prompt_ids, params, self.spec)


class HFTarget:
    """A transformers model with hooks that count and time its forwards (the peers' shared target)."""

    def __init__(self, model_dir: Path, dtype: str, eos_token_ids: frozenset[int], device: str = "cpu") -> None:
        self.model = load_hf_model(model_dir, dtype, device)
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
        synchronize(self.model.device)
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

    def run(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=self.target.model.device)  # [1, prompt]
        first_token = _FirstTokenClock()
        self.target.reset()
        if params.seed is not None:
            torch.manual_seed(params.seed)
        started, cpu_started = time.perf_counter(), time.process_time()
        output = self.target.model.generate(
            input_ids,
            attention_mask=torch.ones_like(input_ids),
            generation_config=self._generation_config(params),
            assistant_model=self.assistant,
            streamer=first_token,
        )  # [1, prompt + new]
        cpu_seconds, wall = time.process_time() - cpu_started, time.perf_counter() - started
        generated = output[0, len(prompt_ids) :].tolist()
        return self._generation(generated, len(prompt_ids), wall, cpu_seconds, first_token.seconds_after(started))

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

    def _generation(
        self, generated: list[int], prompt_length: int, wall: float, cpu_seconds: float, time_to_first_token: float
    ) -> Generation:
        """Counts from the forward hooks: the first forward holds the prompt plus any first draft."""
        eos_at, produced = _end_of_sequence(generated, self.target.eos_token_ids)
        inputs, seconds = self.target.forward_inputs, self.target.forward_seconds
        drafted = (inputs[0] - prompt_length) + sum(n - 1 for n in inputs[1:])
        return Generation(
            token_ids=tuple(generated[:eos_at]),
            finish_reason="length" if eos_at is None else "stop",
            wall_seconds=wall,
            cpu_seconds=cpu_seconds,
            time_to_first_token=time_to_first_token,
            target_forwards=len(inputs),
            steps=len(inputs),
            draft_tokens=drafted,
            accepted_tokens=max(produced - len(inputs), 0),
            verify_seconds=sum(seconds[1:]),
        )


class LlamaCppGenerate:
    """llama.cpp's own generation on the same GGUF file, through a running `LlamaServer`: the same prompt token
    ids, plain temperature sampling (greedy at 0), stopping at the model's end of sequence as quickdraft does."""

    family: Family = "llama.cpp"

    def __init__(self, server: LlamaServer, mode: str, eos_token_ids: frozenset[int]) -> None:
        self.server = server
        self.drafter = mode  # "plain", or the server's --spec-type, e.g. "ngram-simple"
        self.k = None
        self.name = f"llama.cpp:{mode}"
        self.eos_token_ids = eos_token_ids

    def run(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        started, cpu_started = time.perf_counter(), time.process_time()
        reply = self.server.complete(prompt_ids, params.max_new_tokens, params.temperature)
        wall, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
        tokens = [int(t) for t in reply["tokens"]]
        eos_at, produced = _end_of_sequence(tokens, self.eos_token_ids)
        timings = reply.get("timings") or {}
        drafted, accepted = int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
        steps = max(produced - 1 - accepted, 0)  # the prompt's forward yields the first token, each step 1 + accepted
        ended = eos_at is not None or bool(reply.get("stopped_eos"))
        return Generation(
            token_ids=tuple(tokens[:eos_at]),
            finish_reason="stop" if ended else "length",
            wall_seconds=wall,
            cpu_seconds=cpu_seconds,  # this process's only: llama.cpp computes in its own
            time_to_first_token=min(float(timings.get("prompt_ms", 0.0)) / 1000, wall),
            target_forwards=steps + 1,  # the prompt's too
            steps=steps,
            draft_tokens=drafted,
            accepted_tokens=accepted,
            verify_seconds=float(timings.get("predicted_ms", 0.0)) / 1000,
        )


def _end_of_sequence(generated: list[int], eos_token_ids) -> tuple[int | None, int]:
    """(index of the first EOS token or None, tokens the generation yielded, that EOS included)."""
    eos_at = next((i for i, token in enumerate(generated) if token in eos_token_ids), None)
    return eos_at, len(generated) if eos_at is None else eos_at + 1


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


def load_hf_model(model_dir: Path, dtype: str, device: str = "cpu") -> PreTrainedModel:
    """A transformers model from a local directory, eval mode, in `dtype` on `device`."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), use_safetensors=True)
    return model.to(device).eval()


def engine_drafter(drafter: str) -> str:
    """The SpecConfig drafter of a bench drafter: "ngram+head" (joined for auto) -> "ngram,head"."""
    return drafter.replace(JOINER, ",")


def display_name(drafter: str) -> str:
    """A drafter name as shown in tables: paths shortened to their last part, joined drafters kept joined."""
    return JOINER.join(Path(part).name if "/" in part else part for part in drafter.split(JOINER))
