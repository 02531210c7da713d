"""What a prompt block's attention (`layers.attention`, torch's fused kernel) costs in bfloat16 and in float32.

    python scripts/prompt_attention.py --threads 2
    ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 python scripts/prompt_attention.py --threads 2

A 128-query block of smollm2's shapes (9 query heads over 3 key heads, head size 64) after 0, 256 and 700 cached
positions, random inputs; median ms of `--repeats` calls per dtype, and whether the call gave the same bits as
the same call pinned to torch's flash backend. The second command restricts torch's and oneDNN's kernels to AVX2,
as on a CPU without native bfloat16 products, where prompt blocks multiply their matrices in float32
(`weights.prompt_dtype`) but attend in the cache's dtype.
"""

import argparse
import statistics
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from quickdraft.models.native.layers import attention, block_mask

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 128  # smollm2-135m-instruct; runner.PREFILL_BLOCK


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch kernels: {torch.backends.cpu.get_cpu_capability()}")
    for cached in (0, 256, 700):
        timings = []
        for dtype in (torch.bfloat16, torch.float32):
            generator = torch.Generator().manual_seed(cached)
            q = torch.randn(BLOCK, HEADS, HEAD_DIM, generator=generator).to(dtype)  # [n, H, hd]
            keys, values = (
                torch.randn(KV_HEADS, cached + BLOCK, HEAD_DIM, generator=generator).to(dtype) for _ in range(2)
            )  # [KV, L, hd]
            mask = block_mask(cached, BLOCK, None, dtype, torch.device("cpu"))  # [n, L]
            out = attention(q, keys, values, HEAD_DIM**-0.5, mask)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                flash = torch.equal(out, attention(q, keys, values, HEAD_DIM**-0.5, mask))
            seconds = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                attention(q, keys, values, HEAD_DIM**-0.5, mask)
                seconds.append(time.perf_counter() - started)
            timings.append(f"{str(dtype)[6:]} {1e3 * statistics.median(seconds):.3f} ms (flash bits: {flash})")
        print(f"{cached:>4} cached: " + ", ".join(timings))


if __name__ == "__main__":
    main()
