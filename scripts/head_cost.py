"""c, what one drafting step of a draft head costs in one-token target forwards (medians, interleaved), as the
head drafter runs it (its inference form, `drafters/head/inference.py`); the number a head's card reports.

    python scripts/head_cost.py --model smollm2-135m-instruct --threads 2
    python scripts/head_cost.py --model smollm2-135m-instruct --head DIR --rounds 5
    python scripts/head_cost.py --draft-lengths 1,4   # also per token of 4-token drafts, rounds interleaved
"""

import argparse

import torch

from quickdraft.distill.evaluation import cost_ratio
from quickdraft.drafters.head.drafter import head_directory
from quickdraft.drafters.head.files import load_head
from quickdraft.drafters.head.inference import inference_form
from quickdraft.models.loading import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="built-in name or HF directory")
    parser.add_argument("--head", default="", help="a head directory (default: the one shipped for the model)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3, help="measurements of c, each printed")
    parser.add_argument(
        "--draft-lengths", default="1", help="comma list: c per token of drafts this long (1: the cards' c)"
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(args.model)
    head = inference_form(load_head(head_directory(args.head, target.info.name), target))
    lengths = [int(length) for length in args.draft_lengths.split(",")]
    for _ in range(args.rounds):
        print("   ".join(f"c(draft {length}) = {cost_ratio(target, head, length):.3f}" for length in lengths))


if __name__ == "__main__":
    main()
