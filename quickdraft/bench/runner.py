"""`quickdraft bench`: every method on every prompt, interleaved (`measure.interleave`), kept raw.

Rotating the order per prompt spreads machine drift (other jobs, thermal state) evenly over the
methods; the baseline (quickdraft with drafter "none") runs once per prompt per repeat whatever
k is. Every measurement is kept raw; aggregation happens in `summary`.
"""

import sys
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from quickdraft.bench.dataset import Prompt, load_prompts, select_prompts
from quickdraft.bench.llama_cpp import LlamaServer, llama_server
from quickdraft.bench.methods import (
    AUTO,
    JOINER,
    HFGenerate,
    HFTarget,
    LlamaCppGenerate,
    Method,
    QuickdraftMethod,
    engine_drafter,
    load_hf_model,
)
from quickdraft.bench.provenance import machine_info, provenance
from quickdraft.bench.summary import BASELINE, HF_BASELINE
from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.costs import relative_costs, time_forwards
from quickdraft.drafters.base import DrafterLoadOptions
from quickdraft.drafters.draft_model import DraftModelDrafter
from quickdraft.drafters.registry import check_name
from quickdraft.engine import Engine
from quickdraft.errors import UsageError
from quickdraft.measure import Generation, interleave
from quickdraft.models.base import matrix_forms
from quickdraft.models.loading import check_device, load_model_dir
from quickdraft.models.store import converted_from, gguf_source, local_model_dir

WARMUP_TOKENS = 8  # one short untimed generation per method first: no one-time costs in the timings
LLAMA_CPP_MODES = {"plain": (), "ngram-simple": ("--spec-type", "ngram-simple")}  # mode -> llama-server arguments


@dataclass(frozen=True)
class BenchConfig:
    """What one `quickdraft bench` run measures."""

    model: str  # target: built-in name or HF directory
    dataset: Path  # JSONL in the Spec-Bench question format
    drafters: tuple[str, ...] = ("none", "ngram")  # quickdraft drafters; "none" (the baseline) is always run
    ks: tuple[int | str, ...] = (4,)  # draft lengths; each drafter but "none" runs once per k
    categories: tuple[str, ...] | None = None  # None: every category in the file
    limit: int | None = None  # first N prompts of each category
    max_new_tokens: int = 128
    temperature: float = 0.0
    repeats: int = 3
    peers: tuple[str, ...] = ()  # "hf": transformers generate (greedy, prompt lookup, assistant)
    hf_lookup_tokens: int = 4  # prompt_lookup_num_tokens of the transformers peer
    llama_cpp: Path | None = None  # a llama.cpp build's bin/: also time llama-server on the model's GGUF file
    runtime: str = "auto"
    dtype: str = "auto"  # see `run_dtype`
    device: str = "cpu"  # where quickdraft and the transformers peers run (llama.cpp runs as its build does)
    seed: int = 0  # base seed of sampled runs (prompt i, repeat r uses seed + 1000 r + i)
    cost_repeats: int = 10  # repeats of each forward size when measuring v(k)
    progress: bool = True

    @property
    def run_dtype(self) -> str:
        """The dtype every method runs in: auto is the runtime's default, or float32 beside the transformers
        peers, so that quickdraft and transformers run the same weights and their outputs compare token for
        token."""
        return "float32" if self.dtype == "auto" and self.peers else self.dtype

    def __post_init__(self) -> None:
        check_device(self.device)
        if self.peers and self.dtype in ("int8", "gguf"):
            raise UsageError(
                f"--peers hf runs transformers, which has no {self.dtype} weights; "
                "pass --dtype auto, float32 or bfloat16"
            )
        if self.repeats < 1:
            raise UsageError(f"--repeats must be >= 1, got {self.repeats}; speedups need at least one repeat")
        if self.llama_cpp is not None:
            llama_server(self.llama_cpp)  # a build with llama-server, checked before any model loads
        if unknown := [p for p in self.peers if p != "hf"]:
            raise UsageError(f"unknown peers {', '.join(unknown)}; the only peer is hf (transformers generate)")
        for drafter in self.drafters:
            if JOINER in drafter and AUTO not in self.ks:
                raise UsageError(
                    f"{drafter} joins drafters for --k auto to choose between; add auto to --ks, e.g. --ks 4,auto"
                )
            for k in ks_for(drafter, self.ks):
                spec = SpecConfig(drafter=engine_drafter(drafter), k=k)  # validates k before any model loads
                for name in spec.drafters:
                    check_name(name)
        SamplingParams(temperature=self.temperature, max_new_tokens=self.max_new_tokens)


def run_bench(config: BenchConfig) -> dict:
    """Run the benchmark; returns a JSON-ready dict with provenance, costs and every measurement."""
    meta = provenance(config.dataset, torch.get_num_threads())
    prompts = select_prompts(load_prompts(config.dataset), list(config.categories or []) or None, config.limit)
    model_dir = local_model_dir(config.model)
    target = load_model_dir(
        model_dir, runtime=config.runtime, dtype=config.run_dtype, device=config.device, name=config.model
    )
    options = DrafterLoadOptions(runtime=config.runtime, dtype=config.run_dtype, device=config.device)
    engine = Engine(target, SpecConfig(drafter="none"), options)
    chat = bool(target.tokenizer.chat_template)
    encoded = [engine.encode(prompt.first_turn, chat=chat) for prompt in prompts]
    with ExitStack() as servers:
        methods = quickdraft_methods(engine, config) + peer_methods(engine, config, model_dir)
        methods += llama_cpp_methods(engine, config, model_dir, servers)
        _warm_up(methods, encoded[0], config)
        cost_context = sorted(encoded, key=len)[len(encoded) // 2]  # the median-length prompt: a typical context
        forward_seconds = time_forwards(
            target.runner, cost_context, range(1, _largest_k(config.ks) + 2), min_rounds=config.cost_repeats
        )
        rows = _measure_all(methods, prompts, encoded, config)
        _mark_identity(rows, config)
    meta.update(
        finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        machine_at_end=machine_info(torch.get_num_threads()),
        chat_template=chat,
        runner=type(target.runner).__name__,
        weights=matrix_forms(target.runner),  # e.g. {"int4": 120, ...}
    )
    return {
        "meta": meta,
        "config": {
            **asdict(config),
            "dataset": str(config.dataset),
            "llama_cpp": None if config.llama_cpp is None else str(config.llama_cpp),
            "model_dir": str(model_dir),
            "run_dtype": config.run_dtype,
        },
        "prompts": [_prompt_entry(i, p, ids) for i, (p, ids) in enumerate(zip(prompts, encoded))],
        "methods": [{"name": m.name, "family": m.family, "drafter": m.drafter, "k": m.k} for m in methods],
        "cost_context_tokens": len(cost_context),
        "forward_seconds": {str(n): s for n, s in forward_seconds.items()},
        "verify_cost": {str(k): v for k, v in relative_costs(forward_seconds).items()},
        "measurements": rows,
    }


def ks_for(drafter: str, ks: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """The k settings a bench drafter runs at: all of them, or only auto for joined drafters (ngram+head)."""
    return (AUTO,) if JOINER in drafter else ks


def quickdraft_methods(engine: Engine, config: BenchConfig) -> list[Method]:
    """The baseline first, then every other drafter at every k (joined drafters at auto only)."""
    others = [d for d in dict.fromkeys(config.drafters) if d != "none"]
    return [QuickdraftMethod(engine, "none", None)] + [
        QuickdraftMethod(engine, d, k) for d in others for k in ks_for(d, config.ks)
    ]


def peer_methods(engine: Engine, config: BenchConfig, model_dir: Path) -> list[Method]:
    """transformers greedy and prompt lookup, plus assisted generation for each draft-model drafter."""
    if "hf" not in config.peers:
        return []
    target = HFTarget(model_dir, config.run_dtype, engine.target.info.eos_token_ids, config.device)
    peers: list[Method] = [
        HFGenerate(target, "greedy"),
        HFGenerate(target, "lookup", lookup_tokens=config.hf_lookup_tokens),
    ]
    for name in dict.fromkeys(part for drafter in config.drafters for part in drafter.split(JOINER)):
        if isinstance(engine.drafter(name), DraftModelDrafter):
            assistant = load_hf_model(local_model_dir(name, progress=False), config.run_dtype, config.device)
            peers.append(HFGenerate(target, "assistant", assistant=assistant, assistant_name=name))
    return peers


def llama_cpp_methods(engine: Engine, config: BenchConfig, model_dir: Path, servers: ExitStack) -> list[Method]:
    """llama.cpp plain and with its n-gram speculation, each a llama-server on the model's GGUF file (entered
    into `servers`, so they stop with the run), at the same thread count as quickdraft."""
    if config.llama_cpp is None:
        return []
    gguf = gguf_source(config.model) or converted_from(model_dir)
    if gguf is None:
        raise UsageError(
            f"--llama-cpp runs llama.cpp on the GGUF file the model comes from, and {config.model} comes from none "
            "on this machine; pass a built-in model or a .gguf path as --model"
        )
    threads, eos = torch.get_num_threads(), engine.target.info.eos_token_ids
    return [
        LlamaCppGenerate(servers.enter_context(LlamaServer(config.llama_cpp, gguf, threads, args)), mode, eos)
        for mode, args in LLAMA_CPP_MODES.items()
    ]


def _warm_up(methods: list[Method], prompt_ids: list[int], config: BenchConfig) -> None:
    params = SamplingParams(
        temperature=config.temperature, max_new_tokens=min(WARMUP_TOKENS, config.max_new_tokens), seed=config.seed
    )
    for method in methods:
        method.run(prompt_ids, params)


def _measure_all(
    methods: list[Method], prompts: list[Prompt], encoded: list[list[int]], config: BenchConfig
) -> list[dict]:
    """`measure.interleave` over the methods; one raw row per trial."""
    by_name = {method.name: method for method in methods}
    total = config.repeats * len(prompts) * len(methods)
    bar = tqdm(total=total, desc="bench", unit="gen", file=sys.stderr, disable=not config.progress, dynamic_ncols=True)

    def run(name: str, index: int, repeat: int) -> Generation:
        bar.set_postfix_str(f"{prompts[index].category} #{index} {name}", refresh=False)
        seed = config.seed + 1000 * repeat + index
        params = SamplingParams(temperature=config.temperature, max_new_tokens=config.max_new_tokens, seed=seed)
        return by_name[name].run(encoded[index], params)

    categories = [prompt.category for prompt in prompts]
    trials = interleave(list(by_name), categories, config.repeats, run, on_trial=lambda _: bar.update())
    bar.close()
    return [{"question_id": prompts[trial.prompt].question_id, **trial.to_dict()} for trial in trials]


def _mark_identity(rows: list[dict], config: BenchConfig) -> None:
    """Greedy runs: is each output token-identical to the baseline's (and transformers greedy's)?"""
    by_key = {(r["repeat"], r["prompt"], r["method"]): r["token_ids"] for r in rows}
    greedy = config.temperature == 0
    for row in rows:
        baseline = by_key[(row["repeat"], row["prompt"], BASELINE)]
        hf_greedy = by_key.get((row["repeat"], row["prompt"], HF_BASELINE))
        row["identical_to_baseline"] = row["token_ids"] == baseline if greedy else None
        row["identical_to_hf_greedy"] = row["token_ids"] == hf_greedy if greedy and hf_greedy is not None else None


def _largest_k(ks: tuple[int | str, ...]) -> int:
    return max([k for k in ks if isinstance(k, int)], default=0)


def _prompt_entry(index: int, prompt: Prompt, prompt_ids: list[int]) -> dict:
    return {
        "index": index,
        "question_id": prompt.question_id,
        "category": prompt.category,
        "prompt_tokens": len(prompt_ids),
        "text": prompt.first_turn,
    }
