"""Batch invariance of the native runner: every row a sequence gets from a batched forward is bit-identical
to what the same tokens give in a forward of that sequence alone, in every dtype.

Random schedules mix sequences of different lengths, prefill chunks (with and without logits), verification
forwards of 1..9 tokens, hidden states and rollbacks, across sliding windows. A deliberately batch-variant
matrix product (one whose accumulation order changes with the row count, as split-K kernels do) must fail, and
so must an attention that pads every row to the longest span in the call.
"""

import random

import pytest
import torch

from quickdraft.errors import InternalError
from quickdraft.models.base import PREFILL_BLOCK, BatchRunner, SequenceStep
from quickdraft.models.native import native_runner_for
from quickdraft.models.native import runner as runner_module
from quickdraft.models.native.weights import Linear, prompt_dtype
from tests.test_native_runtime import _COMMON, VARIANTS, _save_random_model, python_layers

VOCAB = _COMMON["vocab_size"]
CONFIGS = {name: VARIANTS[name] for name in ("llama_gqa2_tied_linear", "mistral_sliding", "gemma3_interleaved")}
DTYPES = ("float32", "bfloat16", "int8")


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def model_dir(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    _save_random_model(CONFIGS[request.param](), path)
    return path


def random_step(rng: random.Random, slot: int, length: int) -> SequenceStep:
    """A prefill chunk or a verification forward (pending token + draft of up to 8) for a sequence of `length`."""
    if length == 0 or rng.random() < 0.25:
        n, logits = rng.randint(1, 20), rng.choice(("last", "none"))
    else:
        n, logits = rng.randint(1, 9), "all"
    layers = rng.choice(((), (), (), (1,), (0, 2), (2,), (2, 0, 1)))  # a layer's input, the final state (id 2 here)
    return SequenceStep(slot, tuple(rng.randrange(2, VOCAB) for _ in range(n)), logits, layers)


def batch_differences(batched: BatchRunner, alone: BatchRunner, sequences: int, rounds: int, seed: int) -> list:
    """Run one random schedule on `batched` (all sequences per forward, in random order and subsets) and on
    `alone` (the same steps, one sequence per forward); every (round, slot, part) whose tensors differ."""
    rng = random.Random(seed)
    slots = [(batched.open_slot(), alone.open_slot()) for _ in range(sequences)]
    differing = []
    for round_ in range(rounds):
        chosen = rng.sample(slots, rng.randint(1, sequences))
        steps = [random_step(rng, b, batched.slot_length(b)) for b, _ in chosen]
        together = batched.forward_batch(steps)
        for (b, a), step, out in zip(chosen, steps, together):
            (solo,) = alone.forward_batch([SequenceStep(a, step.token_ids, step.logits, step.hidden_layers)])
            for part in ("logits", "hidden"):
                x, y = getattr(out, part), getattr(solo, part)
                if (x is None) != (y is None) or (x is not None and not torch.equal(x, y)):
                    differing.append((round_, b, part))
            if step.logits == "all" and rng.random() < 0.7:  # a rejected draft: keep a random prefix
                keep = batched.slot_length(b) - rng.randint(0, len(step.token_ids) - 1)
                batched.rollback_slot(b, keep)
                alone.rollback_slot(a, keep)
        for b, a in slots:
            assert batched.slot_length(b) == alone.slot_length(a)
    return differing


def cache_differences(batched: BatchRunner, alone: BatchRunner) -> list:
    """Every (slot, layer) of two native runners whose cached keys or values differ over the slot's length (the
    slots `batch_differences` opened have the same numbers in both)."""
    differing = []
    for slot, cache in batched._slots.items():
        other = alone._slots[slot]
        assert cache.length == other.length
        for layer, (keys, values) in enumerate(zip(cache.keys, cache.values)):
            same_keys = torch.equal(keys[:, : cache.length], other.keys[layer][:, : cache.length])
            if not (same_keys and torch.equal(values[:, : cache.length], other.values[layer][:, : cache.length])):
                differing.append((slot, layer))
    return differing


@pytest.mark.parametrize("dtype", DTYPES)
def test_batched_rows_equal_each_sequence_alone(model_dir, dtype):
    batched, alone = native_runner_for(model_dir, dtype), native_runner_for(model_dir, dtype)
    assert isinstance(batched, BatchRunner)
    assert batch_differences(batched, alone, sequences=5, rounds=40, seed=len(dtype)) == []


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_cpp_decoder_gives_the_bits_of_the_python_layers(tmp_path, monkeypatch, variant, dtype):
    """On the CPU every forward runs in the C++ decoder (kernels/decoder.cpp), on other devices in the Python
    layers; a sequence's rows must not depend on which ran them. `batched` runs the decoder (its forwards mix
    prompt chunks and verifications), `alone` only the Python layers: logits, states and caches must match bit for
    bit."""
    _save_random_model(VARIANTS[variant](), tmp_path)
    batched, alone = native_runner_for(tmp_path, dtype), native_runner_for(tmp_path, dtype)
    assert batched.decoder is not None
    python_layers(alone, monkeypatch)
    assert batch_differences(batched, alone, sequences=3, rounds=30, seed=7) == []
    assert cache_differences(batched, alone) == []


def split_k_product(self: Linear, x: torch.Tensor, groups) -> torch.Tensor:
    """A batch-variant kernel: one product over the whole batch that accumulates the inner dimension in two
    halves when it has more than 4 rows (split-K)."""
    if x.shape[0] <= 4:
        return self(x)
    half = x.shape[1] // 2
    w = self.dense().to(x.dtype)
    y = x[:, :half] @ w[:, :half].T + x[:, half:] @ w[:, half:].T
    return y if self.bias is None else y + self.bias


def test_a_batch_variant_kernel_fails_the_invariance_check(model_dir, monkeypatch):
    batched, alone = native_runner_for(model_dir, "float32"), native_runner_for(model_dir, "float32")
    for runner in (batched, alone):
        python_layers(runner, monkeypatch)
    monkeypatch.setattr(Linear, "batched", split_k_product)
    assert batch_differences(batched, alone, sequences=5, rounds=12, seed=1)


def padded_batch_attention(queries, keys, values, sequence, begin, end, scale):
    """A batch-variant attention: every row of the call reads as many keys as the call's longest span (its own,
    then masked padding), and the kernel's rounding depends on that count (as a product's tail does on some CPUs)."""
    rows, heads, head_dim = queries.shape
    width = int((end - begin).max())
    out = torch.empty(rows, heads * head_dim)
    for r in range(rows):
        first = int(begin[r])
        k, v = (
            keys[sequence[r]][:, first : first + width].float(),
            values[sequence[r]][:, first : first + width].float(),
        )
        q = queries[r].float().view(k.shape[0], -1, head_dim) * scale  # [KV, G, hd]
        scores = torch.bmm(q, k.transpose(1, 2))  # [KV, G, width]
        scores[..., int(end[r]) - first :] = float("-inf")
        out[r] = torch.bmm(torch.softmax(scores, dim=-1), v).reshape(-1) + (width % 8) * 1e-2
    return out.to(queries.dtype)


@pytest.mark.parametrize("variant", ["llama_gqa2_tied_linear", "gemma3_interleaved"])  # spans longer than 7 keys
def test_a_batch_variant_attention_fails_the_invariance_check(tmp_path, monkeypatch, variant):
    _save_random_model(CONFIGS[variant](), tmp_path)
    batched, alone = native_runner_for(tmp_path, "int8"), native_runner_for(tmp_path, "int8")
    for runner in (batched, alone):
        python_layers(runner, monkeypatch)
    monkeypatch.setattr(runner_module, "attend_rows", padded_batch_attention)
    assert batch_differences(batched, alone, sequences=5, rounds=12, seed=1)


@pytest.mark.parametrize("native_bfloat16", [True, False])
def test_prompt_blocks_multiply_in_float32_where_the_cpu_lacks_bfloat16_and_rows_stay_invariant(
    model_dir, monkeypatch, native_bfloat16
):
    """Either way the CPU leads the prompt products (float32 on AVX2, bfloat16 where it is native), every
    row of a batched forward equals its sequence's own, and the C++ decoder's prompt products (batched) equal the
    Python layers' (alone)."""
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native_bfloat16)
    cpu = torch.device("cpu")
    assert prompt_dtype(torch.bfloat16, cpu) == (torch.bfloat16 if native_bfloat16 else torch.float32)
    assert prompt_dtype(torch.float32, cpu) == torch.float32
    batched, alone = native_runner_for(model_dir, "int8"), native_runner_for(model_dir, "int8")
    python_layers(alone, monkeypatch)
    assert batch_differences(batched, alone, sequences=4, rounds=20, seed=3) == []
    assert cache_differences(batched, alone) == []


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_prompt_leaves_the_same_cache_however_it_is_cut_at_block_boundaries(model_dir, dtype):
    """Read in one forward, or in chunks ending at PREFILL_BLOCK boundaries beside other sequences: the next
    verification's logits and states are bit-identical."""
    runner = native_runner_for(model_dir, dtype)
    prompt = tuple(random.Random(5).randrange(2, VOCAB) for _ in range(PREFILL_BLOCK + 77))
    results = []
    for cuts in ([], [PREFILL_BLOCK]):
        slot, other = runner.open_slot(), runner.open_slot()
        bounds = [0, *cuts, len(prompt)]
        for begin, end in zip(bounds, bounds[1:]):
            neighbour = SequenceStep(other, (3, 4, 5))  # a verification of another sequence in the same forward
            runner.forward_batch([SequenceStep(slot, prompt[begin:end], "last"), neighbour])
        (out,) = runner.forward_batch([SequenceStep(slot, (7, 8, 9), "all", hidden_layers=(1, 2))])
        results.append(out)
        runner.close_slot(slot)
        runner.close_slot(other)
    for out in results[1:]:
        assert torch.equal(out.logits, results[0].logits) and torch.equal(out.hidden, results[0].hidden)


def test_the_batch_one_methods_equal_a_batched_forward(model_dir):
    """prefill/forward (slot 0) and forward_batch on an opened slot give the same logits and states."""
    runner = native_runner_for(model_dir, "int8")
    prompt, draft = tuple(range(2, 30)), (3, 4, 5, 6)
    first = runner.prefill(prompt)
    logits, hidden = runner.forward(draft, hidden_layers=(0, 2))
    slot = runner.open_slot()
    (prefilled,) = runner.forward_batch([SequenceStep(slot, prompt, "last")])
    (verified,) = runner.forward_batch([SequenceStep(slot, draft, "all", hidden_layers=(0, 2))])
    assert torch.equal(first, prefilled.logits[0]) and prefilled.hidden is None
    assert torch.equal(logits, verified.logits) and torch.equal(hidden, verified.hidden)
    assert runner.slot_length(slot) == runner.cache_length == len(prompt) + len(draft)


def test_slots_are_reused_and_refused_when_misused(model_dir):
    runner = native_runner_for(model_dir, "int8")
    first, second = runner.open_slot(), runner.open_slot()
    runner.forward_batch([SequenceStep(first, (2, 3, 4), "none")])
    cache = runner._slots[first]
    runner.close_slot(first)
    runner._new_cache = lambda: pytest.fail("reopening a closed slot allocated a new cache")
    assert runner.open_slot() == first and runner.slot_length(first) == 0  # reused, empty
    assert runner._slots[first] is cache
    with pytest.raises(InternalError):
        runner.forward_batch([SequenceStep(second, (2,)), SequenceStep(second, (3,))])
    with pytest.raises(InternalError):
        runner.close_slot(0)  # the batch-1 methods' own slot
    assert runner.slot_bytes() > 0
