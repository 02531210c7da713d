"""Running off the CPU (`--device cuda`), tested where CI runs: on the CPU.

On a GPU the native runner runs its Python layers, the plain-torch row operations of `kernels.portable` and
dense products in fixed tiles of rows (`weights.dense_row_tile`). `gpu_path` makes a CPU runner compute that
way, so the exactness the GPU relies on is checked here: verification rows equal 1-token rows and batched rows
equal solo rows bit for bit, even under a dense kernel that changes its arithmetic with the row count (as a
GPU's matrix library does), and that same kernel makes verification rows differ without the tiles (batched rows
stay equal untiled: each sequence's rows then get a product of their own). The check on a real GPU is
`scripts/gpu_check.py` (docs/native_runtime.md carries its output).
"""

import subprocess
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from quickdraft.errors import UsageError
from quickdraft.models import loading
from quickdraft.models.base import SequenceStep
from quickdraft.models.native import default_native_dtype, native_runner_for
from quickdraft.models.native import layers as layers_module
from quickdraft.models.native import runner as runner_module
from quickdraft.models.native import weights as weights_module
from quickdraft.models.native.kernels import attend, portable, rms_norm, rope, silu_mul
from quickdraft.models.native.weights import GPU_ROW_TILE, Linear, dense_row_tile
from tests.test_batch_runtime import CONFIGS, batch_differences
from tests.test_native_runtime import FP32_TOL, _max_diff, _reference, _save_random_model, _tokens


def gpu_path(runner, monkeypatch, tiles: bool = True) -> None:
    """Make a CPU runner compute as it does on a GPU: Python layers, portable row operations, prompt blocks
    attending in one masked product each, dense products in tiles of `GPU_ROW_TILE` rows (or, `tiles=False`,
    untiled: the negative control)."""
    monkeypatch.setattr(runner, "decoder", None)
    monkeypatch.setattr(runner, "prompt_rows_attend_alone", False)
    monkeypatch.setattr(runner_module, "rms_norm", portable.rms_norm)
    monkeypatch.setattr(runner_module, "rope_rows", portable.rope)
    monkeypatch.setattr(runner_module, "attend_rows", portable.attend)
    monkeypatch.setattr(layers_module, "silu_mul", portable.silu_mul)
    for linear in runner.linear_layers():
        monkeypatch.setattr(linear, "row_tile", GPU_ROW_TILE if tiles else None)


def row_count_variant_linear(x, weight, bias=None):
    """A dense product whose arithmetic changes with the row count, as a GPU library's kernel choice does: past 4
    rows it sums the inner dimension in two halves (split-K)."""
    if x.shape[0] <= 4:
        return F.linear(x, weight, bias)
    half = x.shape[1] // 2
    y = x[:, :half] @ weight[:, :half].T + x[:, half:] @ weight[:, half:].T
    return y if bias is None else y + bias


def variant_dense_kernel(monkeypatch) -> None:
    """Every dense product of the runtime's `Linear` through `row_count_variant_linear`."""
    monkeypatch.setattr(weights_module, "F", types.SimpleNamespace(linear=row_count_variant_linear, pad=F.pad))


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model_dir(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    _save_random_model(CONFIGS[request.param](), path)
    return path


def test_portable_row_operations_compute_what_the_cpp_kernels_compute():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 4, 16, generator=gen)  # [N, heads, hd]
    weight = torch.randn(16, generator=gen)
    torch.testing.assert_close(portable.rms_norm(x, weight, 1e-6), rms_norm(x, weight, 1e-6))
    torch.testing.assert_close(portable.rms_norm(x, None, 1e-6), rms_norm(x, None, 1e-6))
    cos, sin_signed = torch.randn(7, 1, 16, generator=gen), torch.randn(7, 1, 16, generator=gen)
    torch.testing.assert_close(portable.rope(x, cos, sin_signed), rope(x, cos, sin_signed))
    gate_up = torch.randn(7, 32, generator=gen)
    torch.testing.assert_close(portable.silu_mul(gate_up), silu_mul(gate_up))
    keys = [torch.randn(2, 30, 16, generator=gen) for _ in range(2)]  # [KV, capacity, hd] per sequence
    values = [torch.randn(2, 30, 16, generator=gen) for _ in range(2)]
    sequence, begin, end = (
        torch.tensor(v) for v in ([0, 1, 1, 0, 1, 0, 0], [0, 3, 0, 5, 0, 0, 9], [1, 9, 30, 6, 2, 17, 30])
    )
    torch.testing.assert_close(
        portable.attend(x, keys, values, sequence, begin, end, 0.25),
        attend(x, keys, values, sequence, begin, end, 0.25),
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dense_products_in_row_tiles_give_each_row_the_bits_of_its_product_alone(monkeypatch, dtype):
    gen = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(48, 64, generator=gen).to(dtype), torch.randn(48, generator=gen).to(dtype)
    rows = torch.randn(40, 64, generator=gen).to(dtype)
    variant_dense_kernel(monkeypatch)

    def differing_counts(row_tile: int | None) -> list[int]:
        linear = Linear(weight, bias, int8=False, row_tile=row_tile)
        alone = torch.cat([linear(rows[i : i + 1]) for i in range(len(rows))])  # [40, 48]
        return [n for n in range(1, len(rows) + 1) if not torch.equal(linear(rows[:n]), alone[:n])]

    assert differing_counts(GPU_ROW_TILE) == []
    assert Linear(weight, bias, int8=False, row_tile=GPU_ROW_TILE).row_invariant
    assert set(range(5, 41)) <= set(differing_counts(None))  # the negative control: untiled, past 4 rows


def one_token_differences(runner, prompt: list[int]) -> list[float]:
    """For verification forwards of 2, 5 and 9 tokens: the largest difference of their rows from the same tokens
    forwarded one at a time."""
    runner.prefill(prompt)
    found = []
    for n in (2, 5, 9):
        base = runner.cache_length
        one_by_one = torch.stack([runner.forward([5 + j])[0] for j in range(n)])  # [n, vocab]
        runner.rollback(base)
        found.append((runner.forward([5 + j for j in range(n)]) - one_by_one).abs().max().item())
        runner.rollback(base + 1)
    return found


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_on_the_gpu_path_verification_rows_equal_one_token_rows_even_under_a_row_count_variant_kernel(
    model_dir, monkeypatch, dtype
):
    variant_dense_kernel(monkeypatch)
    runner = native_runner_for(model_dir, dtype)
    gpu_path(runner, monkeypatch)
    assert one_token_differences(runner, _tokens(20, seed=3)) == [0.0] * 3
    gpu_path(runner, monkeypatch, tiles=False)
    assert max(one_token_differences(runner, _tokens(20, seed=3))) > 0.0


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_on_the_gpu_path_batched_rows_equal_solo_rows_even_under_a_row_count_variant_kernel(
    model_dir, monkeypatch, dtype
):
    """With tiles, the verification rows of every sequence share one tiled product (untiled, each sequence's rows get
    a product of their own: `test_batch_runtime.test_a_batch_variant_kernel_fails_the_invariance_check`)."""
    variant_dense_kernel(monkeypatch)
    batched, alone = native_runner_for(model_dir, dtype), native_runner_for(model_dir, dtype)
    for runner in (batched, alone):
        gpu_path(runner, monkeypatch)
    assert batch_differences(batched, alone, sequences=4, rounds=25, seed=5) == []


def test_on_the_gpu_path_prompt_blocks_attend_as_transformers_does(model_dir, monkeypatch):
    """Off the CPU a prompt block attends in one masked product (`layers.attention` over `block_mask`): a prefill of
    150 tokens (a PREFILL_BLOCK and part of the next) and a 90-token prompt chunk after it that starts mid-block,
    past every sliding window, give transformers' logits within float32 rounding. A wrong window term in the mask
    or a wrong first key for a block would fail here; on the CPU prompt rows attend alone and never take this
    path."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    runner = native_runner_for(model_dir, "float32")
    gpu_path(runner, monkeypatch)
    assert not runner.prompt_rows_attend_alone
    ids = _tokens(240, seed=7)
    reference = _reference(model, ids)
    assert _max_diff(runner.prefill(ids[:150]), reference[149]) <= FP32_TOL
    (out,) = runner.forward_batch([SequenceStep(0, tuple(ids[150:]), "last")])
    assert _max_diff(out.logits[0], reference[239]) <= FP32_TOL


def test_dense_products_run_in_tiles_off_the_cpu_only():
    assert dense_row_tile(torch.device("cpu")) is None
    assert dense_row_tile(torch.device("cuda")) == GPU_ROW_TILE
    assert default_native_dtype(from_gguf=True, device="cuda") == "float32"
    assert default_native_dtype(from_gguf=False, device="cuda:1") == "float32"
    assert default_native_dtype(from_gguf=True) == "gguf"
    loading.check_device("cpu")  # no error


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without a CUDA GPU")
@pytest.mark.parametrize(
    ("device", "message"),
    [
        ("cuda", "sees no CUDA GPU; use --device cpu"),
        ("cuda:1", "sees no CUDA GPU; use --device cpu"),
        ("banana", "names no device"),
        ("meta", "quickdraft runs on cpu or cuda"),
    ],
)
def test_a_device_torch_cannot_run_on_is_a_usage_error(tiny_dirs, device, message):
    with pytest.raises(UsageError, match=message):
        loading.load_model_dir(tiny_dirs["llama"], device=device)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without a CUDA GPU")
@pytest.mark.parametrize(
    "command",
    [
        ["generate", "hi"],
        ["bench", "--prompts", "PROMPTS", "--out", "OUT"],
        ["bench-runtime", "--models", "MODEL"],
        ["batch", "BATCH", "--out", "OUT"],
        ["serve"],
    ],
)
def test_every_command_with_device_says_in_one_line_that_the_gpu_is_missing_and_exits_2(tiny_dirs, tmp_path, command):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"question_id": 1, "category": "qa", "turns": ["hi"]}\n')
    batch = tmp_path / "batch.jsonl"
    batch.write_text('{"prompt": "hi"}\n')
    places = {"PROMPTS": prompts, "BATCH": batch, "OUT": tmp_path / "out", "MODEL": tiny_dirs["llama"]}
    arguments = [str(places.get(a, a)) for a in command]
    if command[0] in ("generate", "bench", "batch", "serve"):
        arguments += ["--model", str(tiny_dirs["llama"])]
    done = subprocess.run(
        [sys.executable, "-m", "quickdraft", *arguments, "--device", "cuda"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert "--device cuda: this torch" in done.stderr and "sees no CUDA GPU" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_quantized_dtypes_on_a_gpu_are_a_usage_error(tiny_dirs):
    with pytest.raises(UsageError, match="use float32 or bfloat16 on cuda"):
        native_runner_for(tiny_dirs["llama"], "int8", "cuda")
