"""Whether the adaptive controller's acceptance estimates say what happens: per drafted step, the draft tokens it
expected to be accepted (`Plan.tokens` - 1) against those accepted; and per draft position of every lookup
proposal (drafted or not), the estimate before the outcome against the outcome (Brier score, calibration by tenth).

    python scripts/acceptance_calibration.py --requests 48 --max-batch 8 --rounds 2 --threads 2

Submits the dev prompts in file order (`--requests` of them) to an `Engine` with `--max-batch` slots (greedy,
`--max-tokens` each) and steps it until all are done, `--rounds` times on one engine (its pooled memory carries
over). It reads the controller through its methods and the running request's `take_verification`, so it runs
unchanged against an older checkout (`PYTHONPATH=<checkout>`). BENCHMARKS.md ("What the controller
expects of its drafts", stop 51) quotes it.
"""

import argparse
import json
from collections import defaultdict

from quickdraft import controller, running
from quickdraft.acceptance import outcomes
from quickdraft.config import SamplingParams
from quickdraft.engine import Engine


class Recorder:
    """Wraps the two methods whose arguments carry what the controller expected and what happened."""

    def __init__(self) -> None:
        self.steps: list[tuple[int, float, int]] = []  # drafted steps: (k, expected accepted, accepted)
        self.positions: list[tuple[float, bool]] = []  # every lookup's positions: (estimate, accepted)
        verify, observe = running.RunningRequest.take_verification, controller.AdaptiveController.observe
        recorder = self

        def take_verification(self, decode, out, committed_length, greedy_ids):
            keep = verify(self, decode, out, committed_length, greedy_ids)
            if decode.plan.k:
                recorder.steps.append((decode.plan.k, decode.plan.tokens - 1, keep - committed_length - 1))
            return keep

        def observe_plan(self, plan, draft, verdict, draft_seconds):
            for name, proposal in plan.lookups.items():
                means = self._estimate(name, proposal.source).means()
                recorder.positions += zip(means, outcomes(proposal.token_ids, verdict.tokens))
            return observe(self, plan, draft, verdict, draft_seconds)

        running.RunningRequest.take_verification = take_verification
        controller.AdaptiveController.observe = observe_plan

    def report(self, round_: int) -> None:
        expected, accepted = sum(s[1] for s in self.steps), sum(s[2] for s in self.steps)
        rows = sum(s[0] for s in self.steps)
        brier = sum((p - ok) ** 2 for p, ok in self.positions) / len(self.positions)
        tenths = defaultdict(list)
        for estimate, ok in self.positions:
            tenths[min(int(estimate * 10), 9)].append((estimate, ok))
        by_tenth = " ".join(
            f"{sum(p for p, _ in pairs) / len(pairs):.2f}:{sum(ok for _, ok in pairs) / len(pairs):.2f}"
            for _, pairs in sorted(tenths.items())
            if len(pairs) >= 50
        )
        print(
            f"round {round_}: {len(self.steps)} drafted steps, {rows} draft rows: expected accepted {expected:.0f}, "
            f"accepted {accepted} ({accepted / expected:.3f} of expected)\n"
            f"  lookup positions {len(self.positions)}: Brier {brier:.4f}; estimate:accepted by tenth {by_tenth}"
        )
        self.steps.clear()
        self.positions.clear()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="built-in name or HF directory")
    parser.add_argument("--drafter", default="ngram", help="drafters for k auto, comma separated")
    parser.add_argument("--prompts", default="../shared/data/specbench_dev.jsonl", help="Spec-Bench style JSONL")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    with open(args.prompts) as lines:
        prompts = [json.loads(line)["turns"][0] for line in lines][: args.requests]
    recorder = Recorder()
    engine = Engine.from_names(args.model, drafter=args.drafter, threads=args.threads, max_batch=args.max_batch)
    for round_ in range(1, args.rounds + 1):
        for prompt in prompts:
            engine.submit(
                [{"role": "user", "content": prompt}], SamplingParams(max_new_tokens=args.max_tokens), chat=True
            )
        while engine.busy:
            engine.step()
        recorder.report(round_)


if __name__ == "__main__":
    main()
