"""Why a head's engine tau is below its teacher-forced tau: both measured on the same text.

    python scripts/head_gap.py --model smollm2-135m-instruct --count 12 --k 4 --threads 2
    python scripts/head_gap.py --prompts ../shared/data/specbench_dev.jsonl --categories writing,roleplay,qa --count 12
    python scripts/head_gap.py --prompt-tokens 400-1000 --count 12   # held-out prompts longer than any trained on

The engine answers each prompt greedily with the head drafting k tokens per step. The training
code's teacher-forced evaluation (`distill.train.evaluate`) then scores the same head on the same
answers, with the target's states from the same runtime: a draft starting at every answer
position. Printed: the engine's tau and acceptance by position (share of steps), and the
teacher-forced tau and conditional acceptance by position. The engine starts a draft only where
the previous step ended (after the target's own token), so it skips the positions inside an
accepted run; the difference between the two on identical text is that selection.
"""

import argparse
from collections.abc import Callable
from itertools import islice

import torch

from quickdraft.bench import dataset
from quickdraft.config import DTYPES, SamplingParams, SpecConfig
from quickdraft.distill import evaluation
from quickdraft.distill.prompts import load_training_prompts
from quickdraft.distill.train import TrainConfig, evaluate, make_example
from quickdraft.drafters.head.drafter import head_directory
from quickdraft.drafters.head.files import load_head
from quickdraft.engine import Engine
from quickdraft.models.loading import load_model
from quickdraft.stats import tau


def prompts_from(args: argparse.Namespace, prompt_length: Callable[[str], int]) -> list[str]:
    """Held-out ShareGPT prompts (never trained on; with --prompt-tokens, those of that many tokens), or the first
    turns of dev prompts in some categories."""
    if not args.prompts:
        training = load_training_prompts(None)
        heldout = evaluation.heldout_prompts(training, len(training))
        if not args.prompt_tokens:
            return heldout[: args.count]
        low, high = args.prompt_tokens
        return list(islice((p for p in heldout if low <= prompt_length(p) <= high), args.count))  # tokenize as needed
    categories = args.categories.split(",") if args.categories else None
    return [p.first_turn for p in dataset.select_prompts(dataset.load_prompts(args.prompts), categories)][: args.count]


def token_range(text: str) -> tuple[int, int]:
    """The text MIN-MAX -> (MIN, MAX)."""
    low, _, high = text.partition("-")
    if not (low.isdigit() and high.isdigit() and int(low) <= int(high)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a token range; give MIN-MAX, e.g. 400-1000")
    return int(low), int(high)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--head", default="", help="head directory (default: the one shipped for the model)")
    parser.add_argument("--prompts", help="Spec-Bench style JSONL instead of the held-out ShareGPT prompts")
    parser.add_argument("--categories", help="with --prompts: comma list of categories to keep")
    parser.add_argument(
        "--prompt-tokens",
        type=token_range,
        help="MIN-MAX: held-out prompts of MIN to MAX tokens in the chat template (distill's default keeps <= 256)",
    )
    parser.add_argument("--count", type=int, default=12)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int)
    parser.add_argument(
        "--dtype", choices=DTYPES, default="auto", help="target weights (the head trains on the default runtime's)"
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    target = load_model(args.model, dtype=args.dtype)
    directory = head_directory(args.head, target.info.name)
    head = load_head(directory, target)
    layers = (*head.config.aux_layers, target.config.get_text_config().num_hidden_layers)  # the head's, the final
    engine = Engine(target, SpecConfig(drafter=f"head:{directory}", k=args.k))
    steps = accepted = 0
    by_position = torch.zeros(args.k)  # [k] steps whose i-th draft token was accepted
    examples = []
    chat = bool(target.tokenizer.chat_template)
    lengths = []
    for text in prompts_from(args, lambda prompt: len(engine.encode(prompt, chat=chat))):
        prompt_ids = engine.encode(text, chat=chat)
        lengths.append(len(prompt_ids))
        result = engine.generate(prompt_ids, SamplingParams(max_new_tokens=args.max_new_tokens))
        stats = result.stats
        steps, accepted = steps + stats.steps, accepted + stats.accepted_tokens
        by_position[: len(stats.accepted_by_position)] += torch.tensor(stats.accepted_by_position, dtype=torch.float)
        sequence = prompt_ids + list(result.token_ids)
        _, hidden = target.runner.prefill(sequence, hidden_layers=layers)  # [T, len(layers) * d]
        d = hidden.shape[1] // len(layers)
        examples.append(make_example(torch.tensor(sequence), hidden[:, :-d], hidden[:, -d:], len(prompt_ids)))
    _, output = target.runner.embedding_matrices()
    forced = evaluate(head, output, examples, TrainConfig(eval_k=args.k))
    median = sorted(lengths)[len(lengths) // 2]
    print(f"{len(lengths)} prompts of {min(lengths)}-{max(lengths)} tokens (median {median})")
    print(
        f"engine, k={args.k}: tau {tau(accepted, steps):.3f}, accepted by position (share of steps) "
        f"{' '.join(f'{float(a) / steps:.3f}' for a in by_position)}"
    )
    print(
        f"teacher-forced, same text: tau {forced['tau']:.3f}, conditional acceptance by position "
        f"{' '.join(f'{a:.3f}' for a in forced['acceptance_by_position'])}"
    )


if __name__ == "__main__":
    main()
