"""Where an engine step's time goes outside the target forward: wall-clock milliseconds a step in each part
(planning and drafting, the step's greedy argmax call, verification and its pieces, finishing requests), timed by
wrapping the engine's methods, over one run of the same requests as `engine_overhead.py`.

    python scripts/step_parts.py --drafters none,ngram+corpus --requests 48 --max-batch 16 --threads 2

A part is timed where it is called, so nested parts (indented) are inside their parent's figure; each wrapper adds
about a microsecond a call, so the figures are upper bounds. One warm-up run, then one timed run per drafter.
BENCHMARKS.md (stop 63) quotes it.
"""

import argparse
import json
import time
from collections import defaultdict
from dataclasses import replace

import quickdraft.engine as engine_module
from quickdraft import running
from quickdraft.config import SamplingParams
from quickdraft.controller import AdaptiveController
from quickdraft.engine import Engine
from quickdraft.output import RequestOutput

PARTS = (  # (owner, method, label): the parts, in the order printed
    (Engine, "step", "step"),
    (None, "forward_batch", "  target forward"),
    (Engine, "_admit", "  admitting requests"),
    (Engine, "_parts", "  planning and drafting (prompt chunks, controllers, drafters)"),
    (engine_module, "argmax_each", "  greedy argmax of every verification"),
    (running.RunningRequest, "take_verification", "  verification"),
    (AdaptiveController, "observe", "    controller learning"),
    (RequestOutput, "commit", "    committing tokens and text"),
    (Engine, "_collect", "  finishing requests, gathering events"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="built-in name or HF directory")
    parser.add_argument("--drafters", default="none,ngram+corpus", help="comma list; + joins drafters for k auto")
    parser.add_argument("--prompts", default="../shared/data/specbench_dev.jsonl", help="Spec-Bench style JSONL")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    firsts = {}
    with open(args.prompts) as lines:
        for line in lines:
            row = json.loads(line)
            firsts.setdefault(row["category"], row["turns"][0])
    prompts = [list(firsts.values())[i % len(firsts)] for i in range(args.requests)]
    params = SamplingParams(max_new_tokens=args.max_tokens)
    for name in args.drafters.split(","):
        engine = Engine.from_names(
            args.model, drafter=name.replace("+", ","), threads=args.threads, max_batch=args.max_batch
        )
        spent: dict[str, float] = defaultdict(float)
        for owner, method, label in PARTS:
            _time_calls(owner or type(engine._batch), method, label, spent)
        _run(engine, prompts, params)  # warm-up: kernels, calibration, caches
        spent.clear()
        steps = _run(engine, prompts, params)
        outside = spent["step"] - spent["  target forward"]
        print(
            f"{name}: {steps} steps, {1e3 * spent['step'] / steps:.2f} ms a step, "
            f"{1e3 * outside / steps:.3f} ms outside the forward"
        )
        for _, _, label in PARTS[1:]:
            print(f"{1e3 * spent[label] / steps:8.3f} ms {label}")
        for owner, method, _ in PARTS:
            _untime(owner or type(engine._batch), method)


def _time_calls(owner, method: str, label: str, spent: dict[str, float]) -> None:
    function = getattr(owner, method)

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - started

    timed.original = function
    setattr(owner, method, timed)


def _untime(owner, method: str) -> None:
    setattr(owner, method, getattr(owner, method).original)


def _run(engine: Engine, prompts: list[str], params: SamplingParams) -> int:
    """Steps to finish every prompt at once (greedy, request i seeded i)."""
    chat = bool(engine.target.tokenizer.chat_template)
    for seed, prompt in enumerate(prompts):
        engine.submit(prompt, replace(params, seed=seed), chat=chat)
    steps = 0
    while engine.busy:
        engine.step()
        steps += 1
    return steps


if __name__ == "__main__":
    main()
