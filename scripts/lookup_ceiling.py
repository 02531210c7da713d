"""How many draft tokens lookup drafting can win on a prompt file, read off the target's own greedy answers.

    python scripts/lookup_ceiling.py --threads 2 --outputs bench-out/greedy-dev.json
    python scripts/lookup_ceiling.py --outputs bench-out/greedy-dev.json --table-fractions 0.25,0.5,1

Greedy verification keeps a draft token exactly when it equals the target's greedy token, so a recorded greedy
answer says, for any proposal at any position, how many of its tokens would be kept: no timing noise. This records
the target's greedy answers to the first turn of every prompt, through its chat template where it has one, as
`quickdraft bench` sends them (`--outputs FILE`: written once, read on later runs), then asks n-gram lookup
(`ngram`) and the corpus table (`corpus`) for `--k-max` tokens at every position of every answer (the context: the
prompt and the answer so far) and prints:

- each drafter's first-token acceptance by `Draft.source`, and its share of positions;
- draft tokens kept per position, for each k of `--ks`: n-gram, corpus, and the better of the two proposals at
  every position (a per-step oracle: no controller choosing between the two drafters keeps more);
- the tokens per target forward (tau) that no controller drafting with them can pass: every step drafts, in
  hindsight, the most tokens one of the drafters would have kept there (at most `--k-max`), so the answer takes
  the fewest forwards these drafters allow; `quickdraft bench` prints the adaptive controller's own tau;
- with `--table-fractions`, the same for corpus tables counted here from the first fraction of the target's data
  shards (`data/distill/<model>`), which shows what more data buys the table.

Positions are averaged alike whether or not a step would start there; the adaptive controller drafts only where it
expects drafts to pay, so its own acceptance differs. Tuning on these prompts is allowed (`../shared/data/README`).
BENCHMARKS.md ("How far lookup drafting goes") quotes it.
"""

import argparse
import json
from collections import Counter
from pathlib import Path

from quickdraft.acceptance import outcomes
from quickdraft.bench.dataset import load_prompts, select_prompts
from quickdraft.config import SamplingParams
from quickdraft.distill.data import load_shards
from quickdraft.distill.table import shard_answers
from quickdraft.drafters.base import Draft
from quickdraft.drafters.corpus import CorpusDrafter, count_table, load_table, table_path
from quickdraft.drafters.ngram import NgramDrafter
from quickdraft.engine import Engine

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a built-in model with a shipped table")
    parser.add_argument("--prompts", default="../shared/data/specbench_dev.jsonl", help="Spec-Bench style JSONL")
    parser.add_argument("--limit", type=int, default=None, help="prompts per category (default: all)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument(
        "--outputs",
        default=None,
        help="JSON file of the greedy answers: read if present (delete it to record again), else written",
    )
    parser.add_argument("--ks", default="1,2,4,8", help="comma list: draft lengths to report")
    parser.add_argument("--k-max", type=int, default=8, help="longest draft of the tau ceiling (the engine's k_max)")
    parser.add_argument("--table-fractions", default="", help="comma list, e.g. 0.25,0.5,1: tables counted from data")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    answers = greedy_answers(args)
    longest = max(*ks, args.k_max)
    ngram = proposals(NgramDrafter(), answers, longest)  # one list per answer: a Draft per position
    shipped = load_table(table_path("", args.model))
    corpus = proposals(CorpusDrafter(shipped), answers, longest)
    tokens = sum(len(answer) for _, answer in answers)
    print(f"{args.model}: {len(answers)} greedy answers, {tokens} tokens")
    for name, drafts in (("ngram", ngram), ("corpus", corpus)):
        print(f"  {name} first-token acceptance by source (share of positions):")
        for source, (share, accepted) in first_token_acceptance(drafts, answers).items():
            print(f"    {source or '(no proposal)':<14} {share:6.1%}  {accepted:6.1%}")
    print_kept("the shipped table", ngram, corpus, answers, ks)
    print(
        f"  tau ceiling (k <= {args.k_max}): ngram alone {tau_ceiling([ngram], answers, args.k_max):.2f}, "
        f"ngram and corpus {tau_ceiling([ngram, corpus], answers, args.k_max):.2f}"
    )
    if args.table_fractions:
        shards = load_shards(REPO / "data" / "distill" / args.model)
        for fraction in (float(f) for f in args.table_fractions.split(",")):
            taken = shards[: max(1, round(len(shards) * fraction))]
            table = count_table(shard_answers(taken), shipped.vocab_size, args.model)
            label = (
                f"{len(taken)} of {len(shards)} shards: {table.answer_tokens} answer tokens, {len(table.keys)} contexts"
            )
            print_kept(label, ngram, proposals(CorpusDrafter(table), answers, longest), answers, ks)


def greedy_answers(args) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, greedy answer ids) per prompt: from --outputs if it exists, else generated (and saved there)."""
    if args.outputs and Path(args.outputs).exists():
        return [(row["prompt_ids"], row["answer_ids"]) for row in json.loads(Path(args.outputs).read_text())]
    engine = Engine.from_names(args.model, drafter="none", threads=args.threads)
    prompts = select_prompts(load_prompts(args.prompts), limit=args.limit)
    answers = []
    chat = bool(engine.target.tokenizer.chat_template)  # as `quickdraft bench` sends them
    for prompt in prompts:
        prompt_ids = engine.encode(prompt.first_turn, chat=chat)
        finished = engine.generate(prompt_ids, SamplingParams(max_new_tokens=args.max_new_tokens))
        answers.append((prompt_ids, list(finished.token_ids)))
    if args.outputs:
        Path(args.outputs).parent.mkdir(parents=True, exist_ok=True)
        rows = [{"prompt_ids": p, "answer_ids": a} for p, a in answers]
        Path(args.outputs).write_text(json.dumps(rows))
    return answers


def proposals(drafter, answers: list[tuple[list[int], list[int]]], k: int) -> list[list[Draft]]:
    """The drafter's k-token proposal at every position of every answer, the context being the prompt and the
    answer before it (a lookup drafter's state only grows with the context, so one pass per answer)."""
    result = []
    for prompt_ids, answer in answers:
        drafter.begin(prompt_ids, SamplingParams(), None)
        context = list(prompt_ids)
        result.append([drafter.propose(context + answer[:t], k) for t in range(len(answer))])
    return result


def kept(draft: tuple[int, ...], answer: list[int], t: int) -> int:
    """Draft tokens greedy verification keeps at position t: the common prefix with the answer from t."""
    return sum(outcomes(draft, answer[t : t + len(draft)]))


def first_token_acceptance(drafts: list[list[Draft]], answers) -> dict[str, tuple[float, float]]:
    """Source -> (its share of positions, how often its first token is the answer's), sources in order."""
    seen, right = Counter(), Counter()
    for per_position, (_, answer) in zip(drafts, answers):
        for t, draft in enumerate(per_position):
            source = draft.source if len(draft) else ""
            seen[source] += 1
            right[source] += kept(draft.token_ids[:1], answer, t)
    total = sum(seen.values())
    return {source: (seen[source] / total, right[source] / seen[source]) for source in sorted(seen)}


def tau_ceiling(drafters: list[list[list[Draft]]], answers, k_max: int) -> float:
    """Answer tokens per target forward when every step drafts, in hindsight, the most tokens one of `drafters`
    would have kept at its position (at most k_max): the fewest steps, by dynamic programming from each answer's
    end (a step at position t with k drafted tokens, all kept, moves to t + k + 1)."""
    total_tokens, total_steps = 0, 0
    for index, (_, answer) in enumerate(answers):
        n = len(answer)
        steps = [0] * (n + 1)  # steps[t]: the fewest forwards that produce answer[t:]
        for t in range(n - 1, -1, -1):
            most = max(kept(drafts[index][t].token_ids[:k_max], answer, t) for drafts in drafters)
            steps[t] = 1 + min(steps[min(n, t + k + 1)] for k in range(most + 1))
        total_tokens += n
        total_steps += steps[0]
    return total_tokens / total_steps


def print_kept(label: str, ngram: list[list[Draft]], corpus: list[list[Draft]], answers, ks: list[int]) -> None:
    """Draft tokens kept per position at each k: each drafter, and the better of the two."""
    sums = {name: Counter() for name in ("ngram", "corpus", "per-step oracle")}
    positions = 0
    for n_drafts, c_drafts, (_, answer) in zip(ngram, corpus, answers):
        for t, (n, c) in enumerate(zip(n_drafts, c_drafts)):
            positions += 1
            for k in ks:
                by_ngram, by_corpus = kept(n.token_ids[:k], answer, t), kept(c.token_ids[:k], answer, t)
                sums["ngram"][k] += by_ngram
                sums["corpus"][k] += by_corpus
                sums["per-step oracle"][k] += max(by_ngram, by_corpus)
    print(f"  draft tokens kept per position, {label}:")
    print(f"    {'':<18}" + "".join(f"{f'k = {k}':>9}" for k in ks))
    for name, by_k in sums.items():
        print(f"    {name:<18}" + "".join(f"{by_k[k] / positions:9.3f}" for k in ks))


if __name__ == "__main__":
    main()
