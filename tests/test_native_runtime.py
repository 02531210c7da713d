"""Native runtime vs transformers on tiny random models of every supported variant.

Each variant is saved with `save_pretrained` (safetensors) and loaded back by both the native
runner and transformers; fp32 logits must agree within 1e-3 for prefill, chunked forwards,
rollbacks and sliding windows shorter than the prompt. bfloat16 and int8 are checked against
the fp32 reference with a looser tolerance: bfloat16 keeps 8 significand bits, so each of the
~30 rounded ops per layer contributes ~0.4 % relative error; logits of these tiny models have
magnitude ~1-5, and we allow 0.15 absolute (int8: 0.3).
"""

import math

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

from quickdraft.errors import InternalError, UsageError
from quickdraft.models.base import ModelRunner
from quickdraft.models.native import kv_cache, native_runner_for
from quickdraft.models.native import runner as runner_module
from quickdraft.models.native.rope import RopeTable
from quickdraft.models.native.spec import RopeFrequencies

FP32_TOL = 1e-3
LOW_PRECISION_TOL = {"bfloat16": 0.15, "int8": 0.3}
VOCAB = 96
_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    eos_token_id=[1, 5],
)

VARIANTS = {
    "llama_mha_untied": lambda: LlamaConfig(
        **_COMMON, num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False
    ),
    "llama_gqa2_tied_linear": lambda: LlamaConfig(
        **_COMMON,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
    ),
    "llama_gqa4_llama3_rope": lambda: LlamaConfig(
        **_COMMON,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=16,
        rope_parameters={
            "rope_type": "llama3",
            "factor": 8.0,
            "rope_theta": 500000.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    "llama_dynamic_rope_bias": lambda: LlamaConfig(
        **_COMMON,
        num_attention_heads=4,
        num_key_value_heads=1,
        attention_bias=True,
        rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    ),
    "qwen2_qkv_bias": lambda: Qwen2Config(
        **_COMMON, num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False
    ),
    "qwen3_qk_norm_sliding": lambda: Qwen3Config(
        **_COMMON,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        use_sliding_window=True,
        sliding_window=6,
        max_window_layers=1,
    ),
    "mistral_sliding": lambda: MistralConfig(**_COMMON, num_attention_heads=4, num_key_value_heads=2, sliding_window=7),
    "gemma3_interleaved": lambda: Gemma3TextConfig(
        **{**_COMMON, "num_hidden_layers": 4},
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=32,
        query_pre_attn_scalar=24,
        sliding_window=5,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    ),
    "gemma3_softcap_untied": lambda: Gemma3TextConfig(
        **_COMMON,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=32,
        sliding_window=4,
        final_logit_softcapping=5.0,
        tie_word_embeddings=False,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    ),
}


def _save_random_model(config, path):
    """Random weights (every parameter, biases and norms included) saved as safetensors.

    Norm weights sit around 1 (Gemma's around 0: it adds the 1 itself) and Gemma's embeddings are divided
    by the sqrt(hidden) it multiplies them by, so no variant's output is its input token again and again:
    a model that ignores its context cannot expose a cache, rollback, rope or window bug (`_greedy_is_alive`).
    """
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    gemma = config.model_type.startswith("gemma")
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.normal_(0.0, 0.15)
            if "norm" in name and not gemma:
                param.add_(1.0)
            if "embed_tokens" in name and gemma:
                param.div_(config.hidden_size**0.5)
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def tiny(request, tmp_path_factory):
    """(directory, transformers model) of one variant, checked to write varied output."""
    path = tmp_path_factory.mktemp(request.param)
    model = _save_random_model(VARIANTS[request.param](), path)
    _greedy_is_alive(path)
    return path, model


def _greedy_is_alive(path, min_distinct: int = 6) -> None:
    """24 greedy tokens after the prompt the speculation test uses hold at least `min_distinct` distinct ones."""
    tokens = _greedy(native_runner_for(path, "float32", "cpu"), _tokens(6, seed=6), 24)
    assert len(set(tokens)) >= min_distinct, f"{path.name} repeats itself: {tokens}"


def _tokens(n, seed):
    return torch.randint(2, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _reference(model, ids):
    """transformers logits [len(ids), vocab] over the whole sequence."""
    with torch.inference_mode():
        return model(torch.tensor([ids]), use_cache=True).logits[0].float()


def _max_diff(a, b):
    return (a - b).abs().max().item()


def test_rope_tables_round_the_float64_cosines_and_sines_of_the_float32_angles_once():
    """Every entry is float32(cos(angle)) (resp. sin, sign-folded) times the scaling, cos taken in float64 (Python's
    `math` here), the angle being transformers' float32 product: one value per angle, whatever computes it. torch's
    float32 cos differs from it by one step in thousands of entries of this table, and gave two different tables for
    the same angles in one process (rope.py)."""
    head_dim, capacity, scaling = 64, 4096, 0.75
    inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    table = RopeTable.build(RopeFrequencies(inv_freq, scaling), capacity, torch.float32, torch.device("cpu"))
    angles = (torch.arange(capacity, dtype=torch.float)[:, None] * inv_freq[None, :]).double().tolist()
    cos = torch.tensor([[math.cos(a) for a in row] for row in angles], dtype=torch.float32) * scaling
    sin = torch.tensor([[math.sin(a) for a in row] for row in angles], dtype=torch.float32) * scaling
    assert torch.equal(table.cos[:, 0], torch.cat((cos, cos), dim=-1))
    assert torch.equal(table.sin_signed[:, 0], torch.cat((-sin, sin), dim=-1))


def test_runner_implements_protocol(tiny):
    runner = native_runner_for(tiny[0], "float32", "cpu")
    assert isinstance(runner, ModelRunner)
    assert runner.info.vocab_size == VOCAB and runner.info.max_context == 256
    assert runner.info.eos_token_ids == frozenset({1, 5})


@pytest.mark.parametrize("length", [1, 9, 23])
def test_prefill_matches_transformers(tiny, length):
    path, model = tiny
    runner = native_runner_for(path, "float32", "cpu")
    ids = _tokens(length, seed=length)
    logits = runner.prefill(ids)
    assert logits.shape == (VOCAB,) and logits.dtype == torch.float32
    assert _max_diff(logits, _reference(model, ids)[-1]) <= FP32_TOL
    assert runner.cache_length == length


def test_chunked_forwards_match_transformers(tiny):
    path, model = tiny
    runner = native_runner_for(path, "float32", "cpu")
    ids = _tokens(30, seed=1)
    reference = _reference(model, ids)
    runner.prefill(ids[:4])
    position = 4
    for size in (1, 5, 2, 9, 1, 8):
        logits = runner.forward(ids[position : position + size])
        assert logits.shape == (size, VOCAB)
        assert _max_diff(logits, reference[position : position + size]) <= FP32_TOL
        position += size


@pytest.mark.parametrize("keep", [3, 12, 17])
def test_rollback_then_new_tokens_equals_fresh_run(tiny, keep):
    """Roll back into (and past) the sliding windows, write different tokens, compare with a fresh sequence."""
    path, model = tiny
    runner = native_runner_for(path, "float32", "cpu")
    first = _tokens(20, seed=2)
    runner.prefill(first[:14])
    runner.forward(first[14:20])
    runner.rollback(keep)
    assert runner.cache_length == keep
    replacement = _tokens(7, seed=3 + keep)
    logits = runner.forward(replacement)
    assert _max_diff(logits, _reference(model, first[:keep] + replacement)[keep:]) <= FP32_TOL
    runner.rollback(keep + 2)
    logits = runner.forward(replacement[2:4])
    assert _max_diff(logits, _reference(model, first[:keep] + replacement)[keep + 2 : keep + 4]) <= FP32_TOL


def test_hidden_layers_are_the_states_transformers_numbers_so(tiny):
    """Id i is what decoder layer i reads (0: the embeddings), id num_layers the final-norm state; asked ids come
    back concatenated in the order given, for every position, from the same forward."""
    path, model = tiny
    runner = native_runner_for(path, "float32", "cpu")
    ids = _tokens(12, seed=4)
    with torch.inference_mode():
        out = model(torch.tensor([ids]), output_hidden_states=True)
    last = model.config.num_hidden_layers
    layers = (last, 0, 1, last - 1)
    logits, hidden = runner.prefill(ids[:8], hidden_layers=layers)
    assert logits.shape == (VOCAB,) and hidden.shape == (8, 64 * len(layers)) and hidden.dtype == torch.float32
    step_logits, step_hidden = runner.forward(ids[8:], hidden_layers=layers)
    assert step_hidden.shape == (4, 64 * len(layers))
    expected = torch.cat([out.hidden_states[i][0] for i in layers], dim=-1)  # [12, 4 * 64]
    assert _max_diff(torch.cat((hidden, step_hidden)), expected) <= FP32_TOL
    assert _max_diff(step_logits, out.logits[0, 8:]) <= FP32_TOL
    runner.rollback(8)
    assert torch.equal(runner.forward(ids[8:]), step_logits)  # asking for states changes nothing else
    with pytest.raises(InternalError, match="hidden layer ids"):
        runner.forward(ids[:1], hidden_layers=(last + 1,))


def test_embedding_matrices_match_the_checkpoint(tiny):
    path, model = tiny
    embeddings, output = native_runner_for(path, "float32", "cpu").embedding_matrices()
    assert torch.equal(embeddings, model.get_input_embeddings().weight)
    assert torch.equal(output, model.get_output_embeddings().weight)
    _, int8_output = native_runner_for(path, "int8", "cpu").embedding_matrices()
    assert (
        _max_diff(int8_output, output) <= 2 * output.abs().max().item() / 127
    )  # int8 rounding plus bf16 weights and scales


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_low_precision_stays_close(tiny, dtype):
    path, model = tiny
    runner = native_runner_for(path, dtype, "cpu")
    ids = _tokens(20, seed=5)
    reference = _reference(model, ids)
    prefill = runner.prefill(ids[:12])
    assert prefill.dtype == torch.float32
    steps = runner.forward(ids[12:])
    assert _max_diff(torch.cat((prefill[None], steps)), reference[11:]) <= LOW_PRECISION_TOL[dtype]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_greedy_speculation_equals_one_token_decoding(tiny, dtype):
    """k-token verification forwards + rollbacks reproduce 1-token greedy decoding in the same dtype."""
    path, _ = tiny
    runner = native_runner_for(path, dtype, "cpu")
    prompt = _tokens(6, seed=6)
    plain = _greedy(runner, prompt, 24)
    rng = torch.Generator().manual_seed(7)
    for draft_of in (
        lambda out, k: plain[len(out) : len(out) + k],  # all accepted
        lambda out, k: torch.randint(2, VOCAB, (k,), generator=rng).tolist(),
    ):  # mostly rejected
        assert _speculative_greedy(runner, prompt, 24, draft_of, k=4) == plain


def _greedy(runner, prompt, steps):
    out = [int(runner.prefill(prompt).argmax())]
    while len(out) < steps:
        out.append(int(runner.forward([out[-1]])[0].argmax()))
    return out


def _speculative_greedy(runner, prompt, steps, draft_of, k):
    out = [int(runner.prefill(prompt).argmax())]
    while len(out) < steps:
        draft = draft_of(out, k)
        base = runner.cache_length
        targets = runner.forward([out[-1]] + draft).argmax(dim=-1).tolist()  # [k + 1]
        accepted = next((i for i, (d, t) in enumerate(zip(draft, targets)) if d != t), len(draft))
        out.extend(targets[: accepted + 1])
        runner.rollback(base + accepted + 1)
    return out[:steps]


def test_cache_grows_past_initial_capacity(tiny, monkeypatch):
    monkeypatch.setattr(kv_cache, "INITIAL_CAPACITY", 8)
    path, model = tiny
    runner = native_runner_for(path, "float32", "cpu")
    ids = _tokens(40, seed=8)
    runner.prefill(ids[:6])
    logits = torch.cat([runner.forward(ids[i : i + 3]) for i in range(6, 39, 3)])
    assert _max_diff(logits, _reference(model, ids)[6:39]) <= FP32_TOL


def test_context_limit_and_bad_rollback_raise(tmp_path):
    _save_random_model(VARIANTS["llama_mha_untied"](), tmp_path)
    runner = native_runner_for(tmp_path, "float32", "cpu")
    runner.prefill(_tokens(250, seed=9))
    with pytest.raises(UsageError):
        runner.forward(_tokens(7, seed=10))
    with pytest.raises(InternalError):
        runner.rollback(251)
    with pytest.raises(UsageError):
        native_runner_for(tmp_path, "float16", "cpu")


def test_unsupported_architecture_returns_none(tmp_path):
    _save_random_model(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2), tmp_path)
    assert native_runner_for(tmp_path, "float32", "cpu") is None


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_verification_rows_equal_one_token_forwards_past_a_long_sliding_window(tmp_path, dtype):
    """Every row of an n-token forward (n = 2, 4 and 9: up to the engine's k_max + 1) is bit-identical to the
    1-token forward at its position, for contexts just before, at and past a sliding window long enough for
    reductions to be blocked."""
    window = 512  # gemma-3-270m's
    config = Gemma3TextConfig(
        **{**_COMMON, "max_position_embeddings": 1024},
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=256,
        sliding_window=window,
        layer_types=["sliding_attention"] * 3,
    )
    _save_random_model(config, tmp_path)
    runner = native_runner_for(tmp_path, dtype, "cpu")
    differences = {}
    for n in (2, 4, 9):
        for context in range(window - n, window + 12):
            runner.prefill(_tokens(context, seed=context))
            base = runner.cache_length
            one_by_one = torch.stack([runner.forward([7 + j])[0] for j in range(n)])  # [n, vocab]
            runner.rollback(base)
            together = runner.forward([7 + j for j in range(n)])  # [n, vocab]
            differences[n, context] = _max_diff(one_by_one, together)
    assert max(differences.values()) == 0.0, {key: d for key, d in differences.items() if d}


ATTEND = runner_module.attend_rows


def python_layers(runner, monkeypatch) -> None:
    """Run every forward of `runner` through the Python layers, whose attention call a test swaps: on the CPU
    every forward otherwise runs in the C++ decoder, which computes the same bits
    (`test_batch_runtime.test_the_cpp_decoder_gives_the_bits_of_the_python_layers`)."""
    monkeypatch.setattr(runner, "decoder", None)


def tail_sensitive_attend(queries, keys, values, sequence, begin, end, scale):
    """An attention kernel whose result depends on how many keys a row is handed: the way a product's tail of
    keys changes its rounding on some CPUs (seen with bfloat16 on AVX2)."""
    out = ATTEND(queries, keys, values, sequence, begin, end, scale)
    return out + (((end - begin) % 8) * 1e-2)[:, None].to(out.dtype)


def all_queries_over_the_last_ones_keys(queries, keys, values, sequence, begin, end, scale):
    """The wrong structure: every row of a sequence reads the keys of that sequence's last row, masked past its
    own position (what one masked product for all queries computes), with the same key-count-sensitive kernel."""
    rows, heads, head_dim = queries.shape
    out = torch.empty(rows, heads * head_dim)
    for r in range(rows):
        mine = sequence == sequence[r]
        first, last = int(begin[mine].min()), int(end[mine].max())
        k, v = keys[sequence[r]][:, first:last].float(), values[sequence[r]][:, first:last].float()  # [KV, L, hd]
        q = queries[r].float().view(k.shape[0], -1, head_dim) * scale  # [KV, G, hd]
        scores = torch.bmm(q, k.transpose(1, 2))
        scores[..., int(end[r]) - first :] = float("-inf")
        out[r] = torch.bmm(torch.softmax(scores, dim=-1), v).reshape(-1) + ((last - first) % 8) * 1e-2
    return out.to(queries.dtype)


@pytest.mark.parametrize("variant", ["llama_gqa2_tied_linear", "mistral_sliding"])
def test_verification_rows_equal_one_token_forwards_even_with_a_kernel_sensitive_to_its_key_count(
    tmp_path, monkeypatch, variant
):
    """Each verification query attends over exactly the keys of the 1-token forward at its position, so a
    kernel whose rounding depends on the number of keys (a longer product's masked tail) cannot tell the two
    apart; every query reading the last query's keys, masked, fails here."""
    monkeypatch.setattr(runner_module, "attend_rows", tail_sensitive_attend)
    _save_random_model(VARIANTS[variant](), tmp_path)
    runner = native_runner_for(tmp_path, "int8", "cpu")  # the dtype whose products are row-invariant
    python_layers(runner, monkeypatch)

    def differences() -> list[float]:
        runner.prefill(_tokens(20, seed=11))
        found = []
        for n in (2, 4, 9):
            base = runner.cache_length
            one_by_one = torch.stack([runner.forward([5 + j])[0] for j in range(n)])  # [n, vocab]
            runner.rollback(base)
            found.append(_max_diff(one_by_one, runner.forward([5 + j for j in range(n)])))
            runner.rollback(base + 1)
        return found

    assert differences() == [0.0] * 3
    monkeypatch.setattr(runner_module, "attend_rows", all_queries_over_the_last_ones_keys)
    assert min(differences()) > 0.0
