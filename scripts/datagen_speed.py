"""Answer tokens per second of `quickdraft distill`'s data stage for each writer dtype, side by side.

    python scripts/datagen_speed.py --dtypes float32,bfloat16 --batch-size 32 --max-new-tokens 64 --rounds 2 --threads 2

Every round, each dtype answers the same batch of ShareGPT prompts with the data stage's own code
(`data.load_writer`, `data.generate_batch`: left-padded transformers `generate` plus the state
hook), dtypes interleaved. Printed: the median answer tokens per second of each dtype and its
ratio to the first, and the dtype `--gen-dtype auto` picks on this machine. Whether bfloat16 is
faster depends on the CPU: without native bfloat16 matrix instructions it is emulated.
"""

import argparse
import statistics
import time

import torch

from quickdraft.config import DEFAULT_MODEL
from quickdraft.distill.data import default_writer_dtype, generate_batch, load_writer
from quickdraft.distill.prompts import load_prompts
from quickdraft.text import encode_prompt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtypes", default="float32,bfloat16", help="comma list of float32, bfloat16, int8")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    dtypes = args.dtypes.split(",")
    writers = {dtype: load_writer(args.model, dtype) for dtype in dtypes}
    tokenizer = writers[dtypes[0]].tokenizer
    encoded = (encode_prompt(tokenizer, p, chat=bool(tokenizer.chat_template), model_name=args.model) for p in load_prompts(None))
    batch = [ids for ids in encoded if len(ids) <= args.max_prompt_tokens][: args.batch_size]
    rates: dict[str, list[float]] = {dtype: [] for dtype in dtypes}
    for _ in range(args.rounds):
        for dtype, writer in writers.items():
            started = time.perf_counter()
            sequences = generate_batch(writer.runner.model, batch, list(range(len(batch))), args.max_new_tokens)
            seconds = time.perf_counter() - started
            rates[dtype].append(sum(len(s.tokens) - s.answer_start for s in sequences) / seconds)
    first = statistics.median(rates[dtypes[0]])
    print(f"{len(batch)} prompts ({sum(map(len, batch))} prompt tokens), {args.max_new_tokens} new tokens, {args.rounds} rounds, "
          f"{torch.get_num_threads()} threads; --gen-dtype auto picks {default_writer_dtype()} here")
    for dtype in dtypes:
        median = statistics.median(rates[dtype])
        print(f"{dtype}: {median:.0f} answer tokens/s (rounds: {', '.join(f'{r:.0f}' for r in rates[dtype])}), {median / first:.2f}x {dtypes[0]}")


if __name__ == "__main__":
    main()
