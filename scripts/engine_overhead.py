"""What a batch of requests costs through the engine, per drafter: the whole run, its target forwards (and the
seconds of those in steps that also read a prompt chunk), the rest (drafting, planning, verifying, bookkeeping) per
step, and where the draft rows went (steps that also read a prompt chunk, or not).

    python scripts/engine_overhead.py --drafters ngram+head,ngram,none --requests 16 --rounds 2 --threads 2
    python scripts/engine_overhead.py --drafters none,ngram+corpus --requests 48 --max-batch 16 --parts

`--parts` also says where the rest goes: wall-clock milliseconds a step in each part outside the forward
(admitting, planning and drafting, the step's greedy argmax, verification and its pieces, finishing), timed by
wrapping the engine's methods (nested parts, indented, are inside their parent's figure; each wrapper adds about a
microsecond a call, so the figures are upper bounds).

Submits the first prompt of each dev-file category (cycled up to `--requests`) at once to an `Engine` with
`--requests` slots (or `--max-batch`: the rest wait for a free slot, as a closed loop of that many streams would),
steps it until every request is done (greedy unless `--temperature`, `--max-tokens` each), once to warm up and then
`--rounds` times per drafter, the drafters interleaved round by round. BENCHMARKS.md ("One 4-bit kernel for every
row count", "Speculation under load", "Prompt blocks on fused attention", stop 63's serving rounds) and
docs/native_runtime.md (stop 42) quote it.
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
from quickdraft.engine import Engine, Finished
from quickdraft.output import RequestOutput

PARTS = (  # (owner, method, label) of `--parts`, in the order printed
    (Engine, "_admit", "admitting requests"),
    (Engine, "_parts", "planning and drafting (prompt chunks, controllers, drafters)"),
    (engine_module, "argmax_each", "greedy argmax of every verification"),
    (running.RunningRequest, "take_verification", "verification"),
    (AdaptiveController, "observe", "  controller learning"),
    (RequestOutput, "commit", "  committing tokens and text"),
    (Engine, "_collect", "finishing requests, gathering events"),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="built-in name or HF directory")
    parser.add_argument(
        "--drafters", default="ngram,none", help="comma list; several drafters joined by + for k auto (ngram+head)"
    )
    parser.add_argument("--prompts", default="../shared/data/specbench_dev.jsonl", help="Spec-Bench style JSONL")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument(
        "--max-batch", type=int, default=None, help="slots (default: --requests; fewer queue the rest, a closed loop)"
    )
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy; > 0: sampled, request i seeded i")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parts", action="store_true", help="also time each part of a step outside the forward")
    args = parser.parse_args()
    firsts = {}
    with open(args.prompts) as lines:
        for line in lines:
            row = json.loads(line)
            firsts.setdefault(row["category"], row["turns"][0])
    prompts = [list(firsts.values())[i % len(firsts)] for i in range(args.requests)]
    engines = {
        name: Engine.from_names(
            args.model, drafter=name.replace("+", ","), threads=args.threads, max_batch=args.max_batch or args.requests
        )
        for name in args.drafters.split(",")
    }
    params = SamplingParams(max_new_tokens=args.max_tokens, temperature=args.temperature)
    spent: dict[str, float] = defaultdict(float)  # seconds in each of PARTS over the latest run
    if args.parts:
        for owner, method, label in PARTS:
            _time_calls(owner, method, label, spent)
    for engine in engines.values():
        run(engine, prompts, params)  # warm-up: kernels, calibration, caches
    for round_ in range(1, args.rounds + 1):
        for name, engine in engines.items():
            spent.clear()
            total, forwards, steps, per_kind, accepted = run(engine, prompts, params)
            print(
                f"round {round_} {name:<8} total {total:.2f} s, target forwards {forwards:.2f} s "
                f"({per_kind['chunk'][2]:.2f} s in steps with a prompt chunk), "
                f"the rest {1e3 * (total - forwards) / steps:.1f} ms a step over {steps} steps; draft rows "
                f"{per_kind['chunk'][1]} in {per_kind['chunk'][0]} steps with a prompt chunk, "
                f"{per_kind['decode'][1]} in {per_kind['decode'][0]} without; {accepted} of them accepted"
            )
            for _, _, label in PARTS if args.parts else ():
                print(f"  {1e3 * spent[label] / steps:7.3f} ms a step  {label}")


def _time_calls(owner, method: str, label: str, spent: dict[str, float]) -> None:
    """Replace owner.method by a wrapper that adds its calls' wall time to spent[label]."""
    function = getattr(owner, method)

    def timed(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - started

    setattr(owner, method, timed)


def run(
    engine: Engine, prompts: list[str], params: SamplingParams
) -> tuple[float, float, int, dict[str, list[float]], int]:
    """(seconds of the whole run, seconds inside target forwards, steps, {"chunk" | "decode": [steps, draft rows,
    forward seconds]} by whether the step read a prompt chunk, draft tokens accepted)."""
    chat = bool(engine.target.tokenizer.chat_template)  # a base model without one reads plain text, as in `bench`
    for seed, prompt in enumerate(prompts):
        engine.submit(prompt, replace(params, seed=seed), chat=chat)
    batch = engine._batch
    forward = batch.forward_batch
    per_kind = {"chunk": [0, 0, 0.0], "decode": [0, 0, 0.0]}

    def timed(parts):
        kind = per_kind["chunk" if any(part.logits != "all" for part in parts) else "decode"]
        kind[0] += 1
        kind[1] += sum(len(part.token_ids) - 1 for part in parts if part.logits == "all")  # past the pending token
        started = time.perf_counter()
        try:
            return forward(parts)
        finally:
            kind[2] += time.perf_counter() - started

    batch.forward_batch = timed
    steps, accepted, started = 0, 0, time.perf_counter()
    try:
        while engine.busy:
            events = engine.step()
            accepted += sum(event.stats.accepted_tokens for _, event in events if isinstance(event, Finished))
            steps += 1
    finally:
        del batch.forward_batch  # the instance attribute: the method shows through again
    forwards = per_kind["chunk"][2] + per_kind["decode"][2]
    return time.perf_counter() - started, forwards, steps, per_kind, accepted


if __name__ == "__main__":
    main()
