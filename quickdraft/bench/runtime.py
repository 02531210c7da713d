"""Runtime benchmark: decode speed and verification cost of the transformers and native runners.

For each model, in one process and interleaved over repeats (so machine noise hits all runners
alike), it measures
- decode tokens/s: `DECODE_STEPS` greedy 1-token forwards after a short prompt;
- v(k) = time of a forward over k+1 new tokens / time of a forward over 1, k = 1..8, on a
  `VERIFY_CONTEXT`-token context, each forward followed by a rollback to that context (`costs.time_forwards`);
for the transformers float32 runner (`HFRunner`: DynamicCache, crop to roll back), native
float32 and the native default configuration (`default_native_dtype`). Medians over repeats.
For each native dtype it also times the model's matrix products alone, once each on one row, as a
native decode step would: the ceiling on tokens/s that removing all other work could reach. And it
measures the machine's read bandwidth (`torch.sum` over a 256 MiB tensor), so each dtype's bytes of
weights read per token give a second ceiling, bandwidth / bytes, and the share of it reached. Given a
llama.cpp build (`llama_cpp`) and a model that comes from a GGUF file, llama.cpp's own decode speed on
that file is measured in the same run, after ours.

Given a llama.cpp build and dev prompts, it also reports how closely each native dtype follows llama.cpp on
the same GGUF: llama-server writes each prompt's greedy continuation (`max_new_tokens` tokens), and each
runner, fed the prompt and that continuation, predicts every next token; the top-1 agreement is the share of
positions where its argmax is llama.cpp's token.

With dev prompts it also answers "is speculative decoding with the n-gram drafter faster than
before the native runtime?": the engine with `ngram` and k auto generates greedily from the same
prompts on each runner, interleaved (`measure.interleave`); tokens/s is the mean over prompts of new
tokens / wall time (prefill included), median over repeats.
"""

import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer

from quickdraft.bench import llama_cpp as llama_cpp_bench
from quickdraft.bench.dataset import Prompt
from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.costs import time_forwards
from quickdraft.engine import Engine
from quickdraft.measure import interleave, measure
from quickdraft.models.base import ModelRunner, synchronize
from quickdraft.models.loading import load_model_dir
from quickdraft.models.native import default_native_dtype, native_runner_for
from quickdraft.models.native.kernels import built_instruction_set
from quickdraft.models.store import converted_from, gguf_source, local_model_dir
from quickdraft.text import encode_prompt

DECODE_PROMPT = 16  # prompt tokens before the decode run
DECODE_STEPS = 64  # greedy 1-token forwards timed per repeat
VERIFY_CONTEXT = 512  # cached tokens under each v(k) forward
VERIFY_KS = tuple(range(1, 9))
VERIFY_INNER = 5  # interleaved rounds of forwards per repeat; their median is that repeat's time
BANDWIDTH_BYTES = 256 << 20  # the tensor summed to measure read bandwidth (far beyond any cache)


@dataclass(frozen=True)
class RuntimeResult:
    """Medians for one runner configuration."""

    tokens_per_second: float  # greedy decode
    verify_cost: dict[int, float]  # k -> v(k)
    matmul_ceiling: float | None  # tokens/s of a step doing only its matrix products (native runners)
    weight_bytes: int | None  # bytes of matrix weights a decode step reads (native runners)


def _decode_seconds(runner, prompt: Sequence[int]) -> float:
    token = int(runner.prefill(prompt).argmax())
    begin = time.perf_counter()
    for _ in range(DECODE_STEPS):
        token = int(runner.forward([token])[-1].argmax())
    return time.perf_counter() - begin


@torch.inference_mode()
def _matmul_seconds(runner: ModelRunner) -> float:
    """Seconds for `DECODE_STEPS` passes over every matrix product of a one-token forward, inputs [1, in]."""
    products = [
        (linear, torch.randn(1, linear.in_features).to(device=runner.device, dtype=runner.dtype))
        for linear in runner.linear_layers()
    ]
    synchronize(runner.device)
    begin = time.perf_counter()
    for _ in range(DECODE_STEPS):
        for linear, x in products:
            linear(x)
    synchronize(runner.device)
    return time.perf_counter() - begin


def weight_bytes(runner: ModelRunner) -> int:
    """Bytes of weights (and their scales and biases) the matrix products of one decode step read."""
    return sum(linear.nbytes for linear in runner.linear_layers())


def read_bandwidth(device: torch.device = torch.device("cpu"), repeats: int = 5) -> float:
    """Bytes per second `torch.sum` reads on `device` from a tensor far larger than the caches (median of
    `repeats`; a GPU's memory on a GPU)."""
    data = torch.ones(BANDWIDTH_BYTES // 4, device=device)
    data.sum()
    seconds = []
    for _ in range(repeats):
        synchronize(device)
        begin = time.perf_counter()
        data.sum()
        synchronize(device)
        seconds.append(time.perf_counter() - begin)
    return BANDWIDTH_BYTES / statistics.median(seconds)


def _one_repeat(runner, tokens: list[int]) -> tuple[float, dict[int, float], float | None]:
    """Decode seconds, forward seconds per new-token count 1..9, and matmul-only seconds for one repeat."""
    decode = _decode_seconds(runner, tokens[:DECODE_PROMPT])
    forward = time_forwards(runner, tokens[:VERIFY_CONTEXT], (1, *[k + 1 for k in VERIFY_KS]), min_rounds=VERIFY_INNER)
    matmuls = _matmul_seconds(runner) if runner.linear_layers() else None
    return decode, forward, matmuls


def bench_model(
    path: Path, repeats: int, native_dtypes: Sequence[str], gguf: Path | None = None, device: str = "cpu"
) -> dict[str, RuntimeResult]:
    """Results keyed "hf" and "native_<dtype>", all measured in this process on `device`, repeats interleaved
    (`gguf`: the file `path` was converted from, for the gguf dtype)."""
    runners: dict[str, ModelRunner] = {"hf": load_model_dir(path, runtime="hf", dtype="float32", device=device).runner}
    runners.update({f"native_{d}": native_runner_for(path, d, device, gguf) for d in native_dtypes})
    vocab = runners[f"native_{native_dtypes[0]}"].info.vocab_size
    tokens = torch.randint(0, vocab, (VERIFY_CONTEXT + 16,), generator=torch.Generator().manual_seed(0)).tolist()
    samples: dict[str, list] = {name: [] for name in runners}
    for _ in range(repeats):
        for name, runner in runners.items():
            samples[name].append(_one_repeat(runner, tokens))
    return {name: _summarise(runs, runners[name]) for name, runs in samples.items()}


@dataclass(frozen=True)
class NgramResult:
    """Speculative decoding with the n-gram drafter (k auto) on dev prompts, per runner."""

    prompts: int
    max_new_tokens: int
    tokens_per_second: dict[str, float]  # runner label -> median over repeats of the mean over prompts
    identical_to_hf: float  # share of native float32 outputs equal token for token to the transformers runner's


def ngram_runners(native_dtypes: Sequence[str]) -> dict[str, tuple[str, str]]:
    """Runner label -> (runtime, dtype): the transformers baseline first, then each native dtype."""
    return {"hf float32": ("hf", "float32"), **{f"native {d}": ("native", d) for d in native_dtypes}}


def bench_ngram(
    path: Path,
    prompts: Sequence[Prompt],
    repeats: int,
    max_new_tokens: int,
    native_dtypes: Sequence[str],
    device: str = "cpu",
) -> NgramResult:
    """Greedy speculative generation with `ngram`, k auto, on each runner, interleaved."""
    engines = {
        label: Engine(
            load_model_dir(path, runtime=runtime, dtype=dtype, device=device), SpecConfig(drafter="ngram", k="auto")
        )
        for label, (runtime, dtype) in ngram_runners(native_dtypes).items()
    }
    first = next(iter(engines.values()))
    chat = bool(first.target.tokenizer.chat_template)
    encoded = [first.encode(prompt.first_turn, chat=chat) for prompt in prompts]
    params = SamplingParams(temperature=0, max_new_tokens=max_new_tokens)
    for engine in engines.values():
        engine.generate(encoded[0], SamplingParams(temperature=0, max_new_tokens=8))  # calibrates the controller
    trials = interleave(
        list(engines),
        [prompt.category for prompt in prompts],
        repeats,
        lambda label, index, _: measure(engines[label], encoded[index], params),
    )
    rates: dict[str, list[float]] = {label: [] for label in engines}
    for repeat in range(repeats):
        for label in engines:
            runs = [t.generation for t in trials if (t.repeat, t.method) == (repeat, label)]
            rates[label].append(statistics.fmean(g.tokens_per_second for g in runs))
    outputs = {(t.repeat, t.prompt, t.method): t.generation.token_ids for t in trials}
    same = [outputs[key] == outputs[key[:2] + ("hf float32",)] for key in outputs if key[2] == "native float32"]
    return NgramResult(
        len(encoded),
        max_new_tokens,
        {label: statistics.median(r) for label, r in rates.items()},
        sum(same) / len(same) if same else float("nan"),
    )


def _summarise(runs: list[tuple[float, dict[int, float], float | None]], runner: ModelRunner) -> RuntimeResult:
    tokens_per_second = statistics.median(DECODE_STEPS / decode for decode, _, _ in runs)
    one = statistics.median(forward[1] for _, forward, _ in runs)
    verify = {k: statistics.median(forward[k + 1] for _, forward, _ in runs) / one for k in VERIFY_KS}
    matmuls = [seconds for _, _, seconds in runs if seconds is not None]
    ceiling = statistics.median(DECODE_STEPS / seconds for seconds in matmuls) if matmuls else None
    return RuntimeResult(tokens_per_second, verify, ceiling, weight_bytes(runner) if runner.linear_layers() else None)


def summary_object(
    model: str,
    results: dict[str, RuntimeResult],
    default_dtype: str,
    bandwidth: float,
    ngram: NgramResult | None = None,
    llama_cpp: dict | None = None,
    device: str = "cpu",
) -> dict:
    """The --json object of one model."""
    native = {name.removeprefix("native_"): r for name, r in results.items() if name != "hf"}
    summary = {
        "model": model,
        "device": device,
        "cpu_kernels": built_instruction_set() if device == "cpu" else None,
        "threads": torch.get_num_threads(),
        "read_bandwidth_gb_per_second": bandwidth / 1e9,
        "default_dtype": default_dtype,
        "hf_tokens_per_second": results["hf"].tokens_per_second,
        "native_fp32_tokens_per_second": native["float32"].tokens_per_second,
        "native_tokens_per_second": native[default_dtype].tokens_per_second,
        "verify_cost": native[default_dtype].verify_cost,
        "hf_verify_cost": results["hf"].verify_cost,
        "native_by_dtype": {
            d: {
                "tokens_per_second": r.tokens_per_second,
                "verify_cost": r.verify_cost,
                "matmul_ceiling_tokens_per_second": r.matmul_ceiling,
                "weight_bytes_per_token": r.weight_bytes,
                "bandwidth_ceiling_tokens_per_second": bandwidth / r.weight_bytes,
                "of_bandwidth_ceiling": r.tokens_per_second * r.weight_bytes / bandwidth,
            }
            for d, r in native.items()
        },
    }
    if llama_cpp is not None:
        summary["llama_cpp"] = llama_cpp
    if ngram is not None:
        summary["ngram_dev"] = {
            "prompts": ngram.prompts,
            "max_new_tokens": ngram.max_new_tokens,
            "tokens_per_second": ngram.tokens_per_second,
            "identical_to_hf": ngram.identical_to_hf,
        }
    return summary


def format_table(summary: dict) -> str:
    """Human-readable table of one model's summary."""
    hf = summary["hf_tokens_per_second"]
    kernels = f", {summary['cpu_kernels']} kernels" if summary["cpu_kernels"] else ""
    lines = [
        f"{summary['model']}  ({summary['device']}{kernels}, {summary['threads']} threads, batch 1, medians; "
        f"read bandwidth {summary['read_bandwidth_gb_per_second']:.1f} GB/s)",
        f"  {'runner':<18}{'tok/s':>8}{'vs hf':>8}{'matmuls only':>14}{'MB/token':>10}{'bw ceiling':>12}{'of it':>7}"
        f"   v(1..8) at {VERIFY_CONTEXT} ctx",
    ]
    lines.append(f"  {'hf float32':<18}{hf:>8.1f}{1:>7.2f}x{'':>43}   {_curve(summary['hf_verify_cost'])}")
    for dtype, r in summary["native_by_dtype"].items():
        tps = r["tokens_per_second"]
        lines.append(
            f"  {'native ' + dtype:<18}{tps:>8.1f}{tps / hf:>7.2f}x{r['matmul_ceiling_tokens_per_second']:>14.1f}"
            f"{r['weight_bytes_per_token'] / 1e6:>10.0f}{r['bandwidth_ceiling_tokens_per_second']:>12.1f}"
            f"{r['of_bandwidth_ceiling']:>7.0%}   {_curve(r['verify_cost'])}"
        )
    if "llama_cpp" in summary:
        peer = summary["llama_cpp"]
        native = summary["native_tokens_per_second"]
        lines.append(
            f"  {'llama.cpp':<18}{peer['tokens_per_second']:>8.1f}{peer['tokens_per_second'] / hf:>7.2f}x"
            f"   (llama-bench on {Path(peer['gguf']).name}, after ours; native default "
            f"{native / peer['tokens_per_second']:.2f}x of it)"
        )
    if "top1_agreement" in summary.get("llama_cpp", {}):
        agreement = summary["llama_cpp"]["top1_agreement"]
        lines.append(
            f"  greedy top-1 agreement with llama.cpp over {summary['llama_cpp']['agreement_positions']} positions"
            f" of its dev-prompt continuations: " + ", ".join(f"{d} {a:.1%}" for d, a in agreement.items())
        )
    lines.append(f"  default native dtype: {summary['default_dtype']}")
    if "ngram_dev" in summary:
        ngram = summary["ngram_dev"]
        speeds = ngram["tokens_per_second"]
        lines.append(
            f"  ngram, k auto, {ngram['prompts']} dev prompts x {ngram['max_new_tokens']} new tokens "
            f"(native float32 identical to hf on {100 * ngram['identical_to_hf']:.0f}%)"
        )
        lines += [f"  {label:<18}{tps:>8.1f}{tps / speeds['hf float32']:>7.2f}x" for label, tps in speeds.items()]
    return "\n".join(lines)


def _curve(verify: dict[int, float]) -> str:
    return " ".join(f"{verify[k]:.2f}" for k in VERIFY_KS)


def run_runtime_bench(
    models: Sequence[str],
    repeats: int = 5,
    json_out: bool = False,
    native_dtypes: Sequence[str] = (),
    dev_prompts: Sequence[Prompt] = (),
    max_new_tokens: int = 64,
    llama_cpp: Path | None = None,
    device: str = "cpu",
) -> list[dict]:
    """Benchmark each model on `device` (and n-gram speculation on `dev_prompts` when given); print a table (or
    one JSON object per line) and return the summaries."""
    summaries = []
    for model in models:
        path = local_model_dir(model, progress=False)
        gguf = converted_from(path)
        default = default_native_dtype(gguf is not None, device)
        dtypes = list(dict.fromkeys(["float32", default, *native_dtypes]))
        results = bench_model(path, repeats, dtypes, gguf, device)
        bandwidth = read_bandwidth(torch.device(device))
        ngram = bench_ngram(path, dev_prompts, repeats, max_new_tokens, dtypes, device) if dev_prompts else None
        peer = None
        if llama_cpp is not None:
            peer = _llama_cpp(llama_cpp, model, path, gguf, repeats, dev_prompts, max_new_tokens, dtypes, device)
        summary = summary_object(model, results, default, bandwidth, ngram, peer, device)
        print(json.dumps(summary) if json_out else format_table(summary), flush=True)
        summaries.append(summary)
    return summaries


def _llama_cpp(
    bin_dir: Path,
    model: str,
    path: Path,
    converted: Path | None,
    repeats: int,
    prompts: Sequence[Prompt],
    tokens: int,
    dtypes: Sequence[str],
    device: str,
) -> dict | None:
    """llama.cpp's decode tokens/s on the model's GGUF file and, with prompts, each native dtype's top-1
    agreement with its greedy continuations (None, said on stderr, when the model has no GGUF file)."""
    gguf = gguf_source(model)
    if gguf is None:
        print(f"bench-runtime: {model} does not come from a GGUF file here; llama.cpp not measured", file=sys.stderr)
        return None
    threads = torch.get_num_threads()
    speed = llama_cpp_bench.decode_tokens_per_second(bin_dir, gguf, threads, DECODE_STEPS, repeats)
    peer = {"gguf": str(gguf), "tokens_per_second": speed}
    if prompts:
        tokenizer = AutoTokenizer.from_pretrained(path)
        chat = bool(tokenizer.chat_template)
        encoded = [encode_prompt(tokenizer, p.first_turn, chat, model) for p in prompts]
        continuations = llama_cpp_bench.greedy_continuations(bin_dir, gguf, encoded, tokens, threads)
        runners = {d: native_runner_for(path, d, device, converted) for d in dtypes}
        peer["top1_agreement"] = {d: top1_agreement(r, encoded, continuations) for d, r in runners.items()}
        peer["agreement_positions"] = sum(len(c) for c in continuations)
    return peer


@torch.inference_mode()
def top1_agreement(runner: ModelRunner, prompts: Sequence[list[int]], continuations: Sequence[list[int]]) -> float:
    """The share of continuation positions where the runner's argmax, given the prompt and the continuation so
    far (teacher forcing), is the continuation's next token."""
    agreeing = total = 0
    for prompt, continuation in zip(prompts, continuations):
        first = runner.prefill(prompt).argmax()[None]  # [1]
        rest = runner.forward(continuation[:-1]).argmax(dim=-1) if len(continuation) > 1 else first[:0]
        predicted = torch.cat((first, rest))  # [len(continuation)]
        agreeing += int((predicted == torch.tensor(continuation, device=predicted.device)).sum())
        total += len(continuation)
    return agreeing / total if total else float("nan")
