"""What a native decode step would cost on a GPU with its launches captured in a CUDA graph: a probe.

The GPU runtime launches every layer's small kernels one by one from Python (docs/native_runtime.md, "On a
GPU"). This script measures how much capturing them would buy, before anyone builds it. For a Llama-family
model (`--model`, a directory; with `--random-weights`, its shapes with random weights, as gpu_check.py
does) it times, medians over `--steps` steps after `--context` cached tokens:

- eager runner: `NativeRunner.forward` of one token, then a rollback (what ships);
- fixed-shape step, eager: the same layers written with every shape fixed (one 16-row tile of rows, attention
  over the whole cache capacity under a mask, cache writes by index), so that they can be captured;
- fixed-shape step, graph: that function captured once in a `torch.cuda.CUDAGraph` and replayed.

The fixed-shape step is a stand-in with the runner's weights and shapes, not the runner: its first row's logits
are reported against the runner's for the same token (a sanity check, not an exactness claim), and its times
bound what capturing could buy, nothing more.
"""

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from quickdraft.models.base import synchronize  # noqa: E402
from quickdraft.models.native import native_runner_for  # noqa: E402
from quickdraft.models.native.kernels import portable  # noqa: E402
from quickdraft.models.native.weights import GPU_ROW_TILE  # noqa: E402

ROWS = GPU_ROW_TILE


def fixed_shape_step(runner, context: int):
    """(step, inputs): `step()` runs one forward of ROWS rows at positions context.. with every tensor shape
    fixed, reading and writing runner's slot-0 cache; `inputs` [ROWS] int64 are its token ids (a static
    buffer to fill before each call). Returns logits [ROWS, vocab]."""
    spec, weights, cache = runner.spec, runner._weights, runner._slots[0]
    llama = spec.activation == "silu" and not (spec.sandwich_norms or spec.qk_norm) and spec.embedding_scale is None
    if not llama or len(set(spec.layer_windows)) != 1:
        raise SystemExit("the probe covers the Llama family only (no sandwich norms, no sliding windows)")
    cache.reserve(context + ROWS - cache.length)
    device, dtype = runner.device, runner.dtype
    heads, kv_heads, head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
    groups, capacity = heads // kv_heads, cache.capacity
    inputs = torch.zeros(ROWS, dtype=torch.long, device=device)
    positions = torch.arange(context, context + ROWS, device=device)  # [ROWS]
    keys = torch.arange(capacity, device=device)  # [C]
    blocked = keys[None, :] > positions[:, None]  # [ROWS, C]: causal
    mask = torch.zeros(blocked.shape, device=device).masked_fill_(blocked, float("-inf")).repeat(groups, 1)
    table = runner._rope[spec.layer_rope[0]]
    cos, sin = table.cos[positions], table.sin_signed[positions]  # [ROWS, 1, hd]
    qk_width = (heads + kv_heads) * head_dim

    def step() -> torch.Tensor:
        x = F.embedding(inputs, weights.embedding)  # [ROWS, d]
        for i, layer in enumerate(weights.layers):
            qkv = layer.qkv(portable.rms_norm(x, layer.input_norm, spec.rms_norm_eps))  # [ROWS, (H + 2 KV) hd]
            qk = portable.rope(qkv[:, :qk_width].view(ROWS, heads + kv_heads, head_dim), cos, sin)
            values = qkv[:, qk_width:].view(ROWS, kv_heads, head_dim)
            cache.keys[i].index_copy_(1, positions, qk[:, heads:].transpose(0, 1))
            cache.values[i].index_copy_(1, positions, values.transpose(0, 1))
            q = qk[:, :heads].reshape(ROWS, kv_heads, groups, head_dim).permute(1, 2, 0, 3)
            q = q.reshape(kv_heads, groups * ROWS, head_dim).float() * spec.attention_scale  # [KV, G ROWS, hd]
            scores = torch.bmm(q, cache.keys[i].float().transpose(1, 2)) + mask  # [KV, G ROWS, C]
            attended = torch.bmm(torch.softmax(scores, dim=-1), cache.values[i].float())  # [KV, G ROWS, hd]
            attended = attended.view(kv_heads, groups, ROWS, head_dim).permute(2, 0, 1, 3).reshape(ROWS, -1)
            x = x + layer.o(attended.to(dtype))
            gate_up = layer.gate_up(portable.rms_norm(x, layer.pre_mlp_norm, spec.rms_norm_eps))
            x = x + layer.down(portable.silu_mul(gate_up))
        return weights.lm_head(portable.rms_norm(x, weights.final_norm, spec.rms_norm_eps)).float()

    return step, inputs


def median_ms(action, steps: int, device: torch.device) -> float:
    seconds = []
    for _ in range(steps):
        synchronize(device)
        started = time.perf_counter()
        action()
        synchronize(device)
        seconds.append(time.perf_counter() - started)
    return 1000 * statistics.median(seconds)


@torch.inference_mode()
def probe(model_dir: Path, dtype: str, device: str, context: int, steps: int) -> dict:
    runner = native_runner_for(model_dir, dtype, device)
    torch_device = torch.device(device)
    prompt = torch.randint(3, runner.info.vocab_size, (context,), generator=torch.Generator().manual_seed(0))
    runner.prefill(prompt.tolist())

    def eager_forward() -> None:
        runner.forward([7])
        runner.rollback(context)

    reference = runner.forward([7])[0]  # [vocab]
    runner.rollback(context)
    eager = median_ms(eager_forward, steps, torch_device)
    step, inputs = fixed_shape_step(runner, context)
    inputs.fill_(7)
    difference = (step()[0] - reference).abs().max().item()
    fixed = median_ms(step, steps, torch_device)
    result = {"model": str(model_dir), "dtype": dtype, "context": context, "rows": ROWS}
    result.update(eager_runner_ms=eager, fixed_shape_eager_ms=fixed, fixed_shape_max_logit_difference=difference)
    if torch_device.type == "cuda":
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        result["fixed_shape_graph_ms"] = median_ms(graph.replay, steps, torch_device)
        result["graph_over_eager_runner"] = eager / result["fixed_shape_graph_ms"]
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="a Llama-family model directory")
    parser.add_argument("--random-weights", action="store_true", help="its config's shapes with random weights")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--context", type=int, default=300, help="cached tokens before each step (default 300)")
    parser.add_argument("--steps", type=int, default=50, help="timed steps per variant (default 50)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model
        if args.random_weights:
            from scripts.gpu_check import random_model

            model_dir = random_model(args.model, Path(scratch) / args.model.name, seed=0)
        for dtype in args.dtypes.split(","):
            print(json.dumps(probe(model_dir, dtype, args.device, args.context, args.steps)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
