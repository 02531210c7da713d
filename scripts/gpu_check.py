"""The native runtime on a GPU (issue #16, item 5): exactness first, then speed, in one short run.

For each model directory given (`--models`, holding config.json and tokenizer files), it builds a model of the
same shapes with random weights (seeded; the real weights do not fit the few minutes and the transfer a GPU
machine is lent for here, and exactness and speed depend on the shapes, not the values), then on `--device`:

1. rows: in float32 and bfloat16, verification forwards of 2..9 tokens against the same tokens forwarded one
   at a time, at two context lengths; the largest difference of any logit must be 0. The same with the dense
   products untiled (`Linear.row_tile = None`): the negative control, which shows whether the GPU's library
   changes a row's bits with the row count (if it stays 0 there too, the check could not have failed here).
2. greedy: the engine with n-gram drafts (k auto) against the target alone in the default dtype, on chat
   prompts, token for token; tokens/s of both, medians over `--repeats`, and their ratio.
3. batch: the same prompts run 4 at a time with n-gram drafts (`Engine.stream_many`: the verification rows of
   several sequences in one tiled product) against the target alone on each: identical outputs.
4. sampled: one generation with temperature 0.8, with drafts and without (they must finish; sampling's exactness
   is a property of the distribution, tested on the CPU).
5. cli: `quickdraft generate --device DEVICE` on the model, as a user would run it.
6. bench-runtime: `bench.runtime.run_runtime_bench` on the random model (decode tok/s, v(k), bandwidth).

Writes OUT/gpu_check.json and prints the report. Meant for the device tool, e.g.
    python3 scripts/gpu_check.py --models .gpu/smollm2-135m-instruct,.gpu/gemma-3-270m --device cuda --out $OUT
and runs anywhere (`--device cpu`) to rehearse it.
"""

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quickdraft.bench.runtime import run_runtime_bench  # noqa: E402
from quickdraft.config import SamplingParams, SpecConfig  # noqa: E402
from quickdraft.engine import Engine  # noqa: E402
from quickdraft.measure import measure  # noqa: E402
from quickdraft.models.base import synchronize  # noqa: E402
from quickdraft.models.loading import load_model_dir  # noqa: E402
from quickdraft.models.native import default_native_dtype, native_runner_for  # noqa: E402
from quickdraft.output import Finished  # noqa: E402

PROMPTS = (
    "Write a short email to a customer whose order arrived late, apologising and offering a discount.",
    "Explain what a hash table is to a new programmer, with one example.",
    "List five ways to save energy at home.",
    "Summarise the plot of a detective story in three sentences.",
    "How do I reset my password if I no longer have the email address?",
    "Translate 'the meeting is moved to Thursday at noon' into French and German.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "What should I pack for a three-day hiking trip?",
)
ROW_COUNTS = tuple(range(2, 10))


def random_model(like: Path, into: Path, seed: int) -> Path:
    """A model directory with `like`'s config and tokenizer files and random weights (seeded)."""
    into.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    config = AutoConfig.from_pretrained(like)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(into, safe_serialization=True)
    for path in like.iterdir():
        if path.suffix != ".safetensors" and path.name != "config.json" and path.is_file():
            shutil.copy(path, into / path.name)
    return into


@torch.inference_mode()
def row_differences(runner, contexts: tuple[int, ...]) -> float:
    """The largest |logit| difference between verification rows of 2..9 tokens and the same tokens one at a time."""
    vocab = runner.info.vocab_size
    worst = 0.0
    for context in contexts:
        tokens = torch.randint(3, vocab, (context + max(ROW_COUNTS),), generator=torch.Generator().manual_seed(context))
        runner.prefill(tokens[:context].tolist())
        for n in ROW_COUNTS:
            new = tokens[context : context + n].tolist()
            one_by_one = torch.stack([runner.forward([t])[0] for t in new])  # [n, vocab]
            runner.rollback(context)
            together = runner.forward(new)  # [n, vocab]
            runner.rollback(context)
            worst = max(worst, (together - one_by_one).abs().max().item())
    return worst


def rows_check(model_dir: Path, device: str) -> dict:
    out = {}
    for dtype in ("float32", "bfloat16"):
        runner = native_runner_for(model_dir, dtype, device)
        tiled = row_differences(runner, (24, 300))
        for linear in runner.linear_layers():
            linear.row_tile = None
        untiled = row_differences(runner, (24, 300))
        out[dtype] = {"max_difference_tiled": tiled, "max_difference_untiled": untiled}
        del runner
    return out


def greedy_check(model_dir: Path, device: str, tokens: int, repeats: int) -> dict:
    dtype = default_native_dtype(False, device)  # float32 on a GPU
    target = load_model_dir(model_dir, dtype=dtype, device=device)
    chat = bool(target.tokenizer.chat_template)
    engine = Engine(target, SpecConfig(drafter="ngram", k="auto"), max_batch=4)
    prompts = [engine.encode(p, chat=chat) for p in PROMPTS]
    params = SamplingParams(temperature=0, max_new_tokens=tokens)
    none = SpecConfig(drafter="none", k=0)
    engine.generate(prompts[0], SamplingParams(temperature=0, max_new_tokens=8))  # calibrates the controller
    rates = {"target alone": [], "ngram, k auto": []}
    outputs = {}
    for _ in range(repeats):
        for label, spec in (("target alone", none), ("ngram, k auto", None)):
            runs = [measure(engine, p, params, spec) for p in prompts]
            rates[label].append(statistics.fmean(g.tokens_per_second for g in runs))
            outputs[label] = [g.token_ids for g in runs]
    steps = [measure(engine, p, params) for p in prompts]
    sampled = SamplingParams(temperature=0.8, seed=1, max_new_tokens=tokens)
    sampled_lengths = [len(engine.generate(prompts[0], sampled, spec=spec).token_ids) for spec in (None, none)]
    batched = {}
    for index, event in engine.stream_many(prompts, params):
        if isinstance(event, Finished):
            batched[index] = tuple(event.token_ids)
    identical = [a == b for a, b in zip(outputs["target alone"], outputs["ngram, k auto"])]
    batch_identical = [batched[i] == alone for i, alone in enumerate(outputs["target alone"])]
    median = {label: statistics.median(r) for label, r in rates.items()}
    return {
        "dtype": dtype,
        "prompts": len(prompts),
        "max_new_tokens": tokens,
        "identical_to_target_alone": sum(identical) / len(identical),
        "batch_of_4_with_drafts_identical_to_alone": sum(batch_identical) / len(batch_identical),
        "tokens_per_second": median,
        "speculation_over_target_alone": median["ngram, k auto"] / median["target alone"],
        "accepted_per_step": sum(g.accepted_tokens for g in steps) / max(1, sum(g.steps for g in steps)),
        "sampled_tokens_with_and_without_drafts": sampled_lengths,
    }


def cli_check(model_dir: Path, device: str) -> dict:
    command = [sys.executable, "-m", "quickdraft", "generate", "--model", str(model_dir), "--device", device]
    done = subprocess.run([*command, "--max-new-tokens", "24", PROMPTS[0]], capture_output=True, text=True)
    return {"exit_code": done.returncode, "stdout": done.stdout[-1500:], "stderr": done.stderr[-1500:]}


def staged(name: str, report: dict, action, save) -> None:
    """Run one stage; its result, or its error with the traceback, goes into `report[name]`; then `save()` (a run
    cut short keeps what it measured)."""
    started = time.perf_counter()
    try:
        report[name] = action()
    except Exception as error:  # a stage that breaks on the GPU is reported and the next one still runs
        report[name] = {"error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()}
    report[name + "_seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps({name: report[name]}, default=str)[:3000], flush=True)
    save()


def check_model(model_dir: Path, args: argparse.Namespace, found: dict, save) -> None:
    stages = {
        "rows": lambda: rows_check(model_dir, args.device),
        "greedy": lambda: greedy_check(model_dir, args.device, args.tokens, args.repeats),
        "cli": lambda: cli_check(model_dir, args.device),
        "bench": lambda: run_runtime_bench([str(model_dir)], repeats=3, device=args.device),
    }
    for name in args.stages.split(","):
        staged(name, found, stages[name], save)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", required=True, help="comma list of model directories (config and tokenizer)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per prompt (default 128)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of the greedy timing (default 3)")
    parser.add_argument("--stages", default="rows,greedy,cli,bench", help="comma list of rows, greedy, cli, bench")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    environment = {"torch": torch.__version__, "device": args.device}
    if args.device.startswith("cuda") and torch.cuda.is_available():
        environment["gpu"] = torch.cuda.get_device_name(args.device)
    report = {"environment": environment, "models": {}}

    def save() -> None:
        (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))

    print(json.dumps(environment), flush=True)
    with tempfile.TemporaryDirectory() as scratch:
        for i, like in enumerate(Path(p) for p in args.models.split(",")):
            model_dir = random_model(like, Path(scratch) / like.name, seed=i)
            found = report["models"][like.name] = {}
            print(f"== {like.name} (random weights, its shapes)", flush=True)
            check_model(model_dir, args, found, save)
            synchronize(torch.device(args.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
