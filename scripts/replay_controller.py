"""Replay `--k auto` and every fixed k on a bench-adaptive run's recorded outputs, priced by its cost model.

    python scripts/replay_controller.py bench-out/adaptive-q5-smollm2-135m-instruct \
        --prompts ../shared/data/specbench_dev.jsonl --per-category 3

Timing noise on a shared 2-core machine is as large as the differences between auto and the best
fixed k; this takes it out (`quickdraft.bench.replay`). Each quality prompt's recorded target
output is decoded again by the engine under each policy, a step drafting k tokens costs
v(k) = t(k + 1) / t(1) from the run's final cost model, and prompts run in the bench's order with
one controller memory, as in the bench. Printed per category: decode speed in tokens per t(1),
which is the decode speedup over the target alone (the prefill is left out: it is the same for
every setting), and auto over the best fixed k. Not seen: drafting and controller time (small for
n-gram), and anything the cost model misses (the real t(n) grows with the context).
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

from transformers import AutoTokenizer

from quickdraft.bench.adaptive_report import fixed_k, fixed_labels
from quickdraft.bench.dataset import load_prompts, select_prompts
from quickdraft.bench.replay import replay
from quickdraft.controller import ControllerMemory
from quickdraft.costs import TargetCost
from quickdraft.models.store import local_model_dir
from quickdraft.text import encode_prompt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run", type=Path, help="a quickdraft bench-adaptive --out directory with the quality case")
    parser.add_argument("--prompts", required=True, help="the JSONL file the run used")
    parser.add_argument("--per-category", type=int, default=2, help="the run's --per-category (default 2)")
    parser.add_argument(
        "--model", default="smollm2-135m-instruct", help="the run's --model (its tokenizer renders the prompts)"
    )
    args = parser.parse_args()
    trials = json.loads((args.run / "adaptive-raw.json").read_text())["quality"]  # the quality case's trial records
    quality = json.loads((args.run / "adaptive.json").read_text())["results"]["quality"]
    v = quality["costs"]["end"]["v"]  # [k_max + 1]
    outputs = {t["prompt"]: t["token_ids"] for t in trials if t["method"] == "target" and t["repeat"] == 0}
    tokenizer = AutoTokenizer.from_pretrained(local_model_dir(args.model))
    prompts = select_prompts(load_prompts(args.prompts), limit=args.per_category)
    chat = bool(tokenizer.chat_template)  # as bench-adaptive: a base model without a template sees plain text
    encoded = [encode_prompt(tokenizer, p.first_turn, chat, args.model) for p in prompts]
    if quality.get("drafters", ["ngram"]) != ["ngram"]:
        parser.error(
            f"{args.run} compared {', '.join(quality['drafters'])}; "
            "the replay covers runs with the n-gram drafter alone"
        )
    settings = {label: fixed_k(label) for label in fixed_labels(quality["speeds"]["overall"])} | {
        "auto": None
    }  # the run's fixed ks
    memory = ControllerMemory(TargetCost(v))
    speeds = {}  # setting -> category -> tokens per t(1)
    for label, k in settings.items():
        cost, tokens = defaultdict(float), defaultdict(int)
        for index, prompt in enumerate(prompts):
            output = outputs[index]
            if len(output) > 1:
                steps = replay(encoded[index], output, k, memory, tokenizer)
                cost[prompt.category] += sum(v[drafted] for drafted in steps)
                tokens[prompt.category] += len(output) - 1
        cost["overall"], tokens["overall"] = sum(cost.values()), sum(tokens.values())
        speeds[label] = {category: tokens[category] / cost[category] for category in cost}
    print(f"cost model v(k) = t(k+1)/t(1), k = 0..: {' '.join(f'{x:.2f}' for x in v)}")
    print("| category | " + " | ".join(settings) + " | auto / best fixed |")
    print("|---" * (len(settings) + 2) + "|")
    for category in speeds["auto"]:
        best = max(speeds[label][category] for label in settings if label != "auto")
        row = " | ".join(f"{speeds[label][category]:.3f}" for label in settings)
        print(f"| {category} | {row} | {speeds['auto'][category] / best:.3f} |")


if __name__ == "__main__":
    main()
