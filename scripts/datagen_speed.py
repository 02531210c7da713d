"""Answer tokens per second of `quickdraft distill`'s data stage per writer dtype and batch size, side by side.

    python scripts/datagen_speed.py --dtypes float32,bfloat16 --batch-sizes 32 --count 32 \
        --max-new-tokens 64 --rounds 2 --threads 2
    python scripts/datagen_speed.py --dtypes float32 --batch-sizes 16,32,64 --count 64 \
        --max-new-tokens 64 --rounds 2 --threads 2

Every round, each (dtype, batch size) writes one shard's worth of answers to the same ShareGPT
prompts with the data stage's own code (`data.load_writer`, `data.answer_chunk`: prompts over
--max-prompt-tokens skipped, the rest sorted by length and answered in left-padded transformers
`generate` batches with the state hook), settings interleaved. Printed: the median answer tokens
per second of each setting and its ratio to the first, and the dtype `--gen-dtype auto` picks on
this machine. Whether bfloat16 is faster depends on the CPU: without native bfloat16 matrix
instructions it is emulated.
"""

import argparse
import statistics
import time

import torch

from quickdraft.config import DEFAULT_MODEL
from quickdraft.distill.data import AnswerConfig, answer_chunk, default_writer_dtype, load_writer
from quickdraft.distill.prompts import load_training_prompts
from quickdraft.models.loading import transformers_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma list of float32, bfloat16, int8")
    parser.add_argument(
        "--batch-sizes", default="64", help="comma list of sequences per generate call (distill's --batch-size)"
    )
    parser.add_argument("--count", type=int, default=64, help="prompts answered by each setting each round")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtypes, sizes = args.dtypes.split(","), [int(size) for size in args.batch_sizes.split(",")]
    writers = {dtype: load_writer(args.model, dtype) for dtype in dtypes}
    prompts = load_training_prompts(None)
    settings = [(dtype, size) for dtype in dtypes for size in sizes]
    rates: dict[tuple[str, int], list[float]] = {setting: [] for setting in settings}
    for _ in range(args.rounds):
        for dtype, size in settings:
            config = AnswerConfig(
                max_new_tokens=args.max_new_tokens,
                batch_size=size,
                chunk_prompts=args.count,
                max_prompt_tokens=args.max_prompt_tokens,
                dtype=dtype,
            )
            writer = writers[dtype]
            started = time.perf_counter()
            shard = answer_chunk(transformers_model(writer), writer.tokenizer, prompts, list(range(args.count)), config)
            rates[dtype, size].append(shard.answer_tokens / (time.perf_counter() - started))
    first = statistics.median(rates[settings[0]])
    print(
        f"{args.count} prompts (those over {args.max_prompt_tokens} tokens skipped), "
        f"at most {args.max_new_tokens} new tokens, "
        f"{args.rounds} rounds, {torch.get_num_threads()} threads; --gen-dtype auto picks {default_writer_dtype()} here"
    )
    for dtype, size in settings:
        median = statistics.median(rates[dtype, size])
        print(
            f"{dtype}, batch {size}: {median:.0f} answer tokens/s "
            f"(rounds: {', '.join(f'{r:.0f}' for r in rates[dtype, size])}), "
            f"{median / first:.2f}x {settings[0][0]}, batch {settings[0][1]}"
        )


if __name__ == "__main__":
    main()
