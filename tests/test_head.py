"""The head drafter: its model, exactness in the engine, the reduced vocabulary, and target checks."""

import json
import subprocess
import sys
from collections import Counter

import pytest
import torch
from safetensors.torch import load_file, save_file
from scipy.stats import chisquare

from quickdraft import sampling
from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.controller import ControllerMemory
from quickdraft.costs import DraftCost, TargetCost
from quickdraft.distill.evaluation import cost_ratio
from quickdraft.drafters.base import DrafterLoadOptions
from quickdraft.drafters.head import drafter as head_drafters
from quickdraft.drafters.head.drafter import HeadDrafter
from quickdraft.drafters.head.files import build_head, export, load_head, save_head
from quickdraft.drafters.head.identity import target_identity
from quickdraft.drafters.head.inference import InferenceHead, four_bit_linear, inference_form
from quickdraft.drafters.head.model import DraftHead, HeadCache, HeadConfig, default_aux_layers
from quickdraft.engine import Engine
from quickdraft.errors import UsageError
from quickdraft.verify import rejection_sample

PROMPTS = ["The quick brown fox", "café 東京"]
GREEDY = SamplingParams(max_new_tokens=24, ignore_eos=True)


def random_head(target, vocab_ids=None, seed=0, inference=False):
    """A random head in float32 or in its inference form (4-bit group matrices, the layer in C++: what the `head`
    drafter loads on CPU)."""
    torch.manual_seed(seed)
    vocab_ids = torch.arange(target.info.vocab_size) if vocab_ids is None else vocab_ids
    config = HeadConfig.like_target(target.config.get_text_config(), len(vocab_ids))
    head = build_head(config, target, vocab_ids)
    for parameter in head.parameters():  # large weights: drafts far from uniform, so tests see accepts and rejects
        torch.nn.init.normal_(parameter, std=0.3) if parameter.dim() > 1 else None
    return inference_form(head) if inference else head.eval()


def head_engine(target, head, k):
    engine = Engine(target, SpecConfig(drafter="head-test", k=k))
    engine._drafters["head-test"] = HeadDrafter(head, target.info.vocab_size, "head-test")
    return engine


def target_states(target, prompt, head):
    """(logits [vocab], the states the head reads [len(prompt), 3 * d]) of a prefill."""
    return target.runner.prefill(prompt, hidden_layers=head.config.aux_layers)


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_unrolled_training_matches_step_by_step_drafting(tiny_models, norm_before_residual):
    """Step s of the parallel training forward (training-time test) equals drafting s tokens with a cache after
    true context, on the head's own outputs."""
    head = random_head(tiny_models["llama"])
    head.layer.norm_before_residual = norm_before_residual
    length, steps = 12, 3
    aux = torch.randn(1, length, len(head.config.aux_layers) * head.config.target_hidden_size)  # [1, T, 3d]
    tokens = torch.randint(0, 300, (1, length))  # [1, T] x_{t+1}
    with torch.no_grad():
        stream = head.fuse(aux)  # [1, T, d]
        parallel = head.unrolled(stream, tokens, steps)  # steps x [1, T, d]
        for t in range(steps - 1, length):
            for s in range(1, steps + 1):
                cache = HeadCache()
                context_end = t - s + 1  # true pairs 0..context_end
                out = head.step(stream[0, : context_end + 1], tokens[0, : context_end + 1], cache)[-1]
                for position in range(context_end + 1, t + 1):
                    out = head.step(out[None], tokens[0, position : position + 1], cache)[-1]
                torch.testing.assert_close(parallel[s - 1][0, t], out, rtol=1e-3, atol=1e-3)  # float32 rounding


def test_the_head_reads_the_target_states_eagle3_fuses_and_its_first_layer_is_eagle3s():
    """Aux layers 2, L // 2, L - 3 (vLLM's and SpecForge's choice); q, k and v read [embedding ; stream]."""
    from transformers import LlamaConfig

    config = HeadConfig.like_target(
        LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=30, num_attention_heads=4), 100
    )
    assert config.aux_layers == (2, 15, 27) and config.target_hidden_size == 64
    head = DraftHead(config, torch.zeros(500, 64), torch.arange(100))
    shapes = {name: tuple(t.shape) for name, t in head.state_dict().items()}
    assert shapes == {
        "fc.weight": (64, 192),
        "layers.0.input_layernorm.weight": (64,),
        "layers.0.hidden_norm.weight": (64,),
        "layers.0.self_attn.q_proj.weight": (64, 128),
        "layers.0.self_attn.k_proj.weight": (64, 128),
        "layers.0.self_attn.v_proj.weight": (64, 128),
        "layers.0.self_attn.o_proj.weight": (64, 64),
        "layers.0.post_attention_layernorm.weight": (64,),
        "layers.0.mlp.gate_proj.weight": (96, 64),
        "layers.0.mlp.up_proj.weight": (96, 64),
        "layers.0.mlp.down_proj.weight": (64, 96),
        "norm.weight": (64,),
        "lm_head.weight": (100, 64),
    }


def test_four_bit_groups_hold_each_weight_within_half_a_step_of_a_grid_spanning_the_group():
    """The head's 4-bit quantizer (GGUF's Q4_1, float16 scale and min): every weight within half a step of its
    group's grid, the grid spanning the group (its min at or below the group's, 16 steps reaching its max), a
    group of equal weights exact; the kernel's product is the product of exactly those weights (activations in
    int8 per 32 aside)."""
    torch.manual_seed(0)
    weight = torch.randn(64, 96) * torch.rand(64, 1)  # rows of different ranges
    weight[0, :32], weight[1, 32:64] = 0.5, 0.0  # groups of equal weights: a zero range
    linear = four_bit_linear(weight)
    assert linear.form == "int4"
    snapped = linear.dense()  # [64, 96]
    groups, snapped_groups = weight.view(64, 3, 32), snapped.view(64, 3, 32)
    steps = (groups.amax(-1) - groups.amin(-1)) / 15  # [64, 3]
    assert ((snapped_groups - groups).abs() <= steps[..., None] * (0.5 + 2**-9) + 1e-7).all()
    assert (snapped_groups.amin(-1) <= groups.amin(-1)).all()
    assert torch.equal(snapped[0, :32], weight[0, :32]) and torch.equal(snapped[1, 32:64], weight[1, 32:64])
    x = torch.randn(5, 96)
    assert torch.allclose(linear(x), x @ snapped.T, rtol=0.05, atol=0.05 * float((x @ snapped.T).abs().mean()))


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_inference_form_drafts_like_the_float_head_and_feeds_pairs_one_by_one_or_together(
    tiny_models, norm_before_residual
):
    """The inference form (4-bit group matrices, the layer in C++) computes the float module's function on the same
    4-bit weights: its logits move by a few percent (int8 activations), rarely the drafts. Pairs fed in one call
    equal the same pairs fed one by one, bit for bit, past the cache's first growth (each pair attends over exactly
    the cache up to its own position)."""
    target = tiny_models["llama"]
    float_head = random_head(target)
    float_head.layer.norm_before_residual = norm_before_residual
    fast = InferenceHead(float_head)
    attention, mlp = float_head.layer.self_attn, float_head.layer.mlp
    matrices = (attention.q_proj, attention.k_proj, attention.v_proj, attention.o_proj, mlp.gate_proj, mlp.up_proj)
    with torch.no_grad():
        for module in (float_head.fc, *matrices, mlp.down_proj, float_head.lm_head):  # the weights fast computes with
            module.weight.copy_(four_bit_linear(module.weight).dense())
    length = 300  # the head cache starts with room for 256 positions
    aux = torch.randn(length, 3 * float_head.config.target_hidden_size)  # [T, 3d]
    tokens = torch.randint(0, target.info.vocab_size, (length,))  # [T]
    with torch.no_grad():
        expected = float_head.draft_logits(float_head.step(float_head.fuse(aux), tokens, HeadCache()))  # [T, vocab]
    stream = fast.fuse(aux)  # [T, d]
    together = fast.step(stream, tokens, HeadCache())  # [T, d]
    actual = fast.draft_logits(together)
    assert (actual - expected).norm() < 0.1 * expected.norm()  # int8 activations move them ~4% here, a wrong step ~100%
    assert (actual.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.9
    cache = HeadCache()
    alone = torch.cat([fast.step(stream[t : t + 1], tokens[t : t + 1], cache) for t in range(length)])
    assert torch.equal(alone, together)
    assert torch.equal(fast.draft_logits(alone[-1]), actual[-1])


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
@pytest.mark.parametrize("k", [1, 5])
@pytest.mark.parametrize("inference", [False, True])
def test_greedy_output_identical_with_head_drafter(tiny_models, arch, k, inference):
    target = tiny_models[arch]
    vocab_ids = torch.arange(0, target.info.vocab_size, 2)  # half the vocabulary: some drafts impossible
    engine = head_engine(target, random_head(target, vocab_ids, inference=inference), k)
    baseline = Engine(target, SpecConfig(drafter="none"))
    for prompt in PROMPTS:
        expected = baseline.generate(prompt, GREEDY)
        result = engine.generate(prompt, GREEDY)
        assert result.token_ids == expected.token_ids, prompt
        assert result.stats.draft_tokens > 0


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_adaptive_controller_with_head_and_ngram_keeps_greedy_output(tiny_models, arch):
    """k=auto feeds the head target states on every step, drafting or not. Costs are pinned (verification as
    cheap as a 1-token step, a cheap head), so the controller does draft with the head: with live timings it
    might never, and the test would prove nothing."""
    target = tiny_models[arch]
    head = random_head(target, torch.arange(0, target.info.vocab_size))
    costs = ControllerMemory(TargetCost([1.0] * 9))
    costs.add_draft_cost("head-test", DraftCost(0.01))
    engine = Engine(target, SpecConfig(drafter="ngram,head-test", k="auto"), costs=costs)
    engine.add_drafter("head-test", HeadDrafter(head, target.info.vocab_size, "head-test"))
    baseline = Engine(target, SpecConfig(drafter="none"))
    head_steps = 0
    for prompt in PROMPTS:
        result = engine.generate(prompt, GREEDY)
        assert result.token_ids == baseline.generate(prompt, GREEDY).token_ids, prompt
        head_steps += result.stats.drafter_steps.get("head-test", 0)
    assert head_steps > 0


def test_greedy_drafts_map_the_heads_best_logit_through_its_vocabulary_map(tiny_models):
    """Each greedy draft token is vocab_ids[argmax of the head's draft logits], recomputed here from the head's
    own step over the same pairs (a map off by one still drafts exact output, only slower, so greedy equality
    cannot see it)."""
    target = tiny_models["llama"]
    vocab_ids = torch.randperm(target.info.vocab_size, generator=torch.Generator().manual_seed(0))[:150]
    head = random_head(target, vocab_ids)
    drafter = HeadDrafter(head, target.info.vocab_size, "h")
    prompt = Engine(target).encode("Once upon a time")
    logits, hidden = target_states(target, prompt, head)  # [vocab], [prompt, 3d]
    context = prompt + [int(logits.argmax())]
    drafter.begin(prompt, SamplingParams(), torch.Generator())
    drafter.observe_target(hidden)
    draft = drafter.propose(context, 3)
    with torch.inference_mode():
        cache = HeadCache()
        out = head.step(head.fuse(hidden), torch.tensor(context[1:]), cache)[-1]  # [d]
        expected = []
        for _ in range(3):
            expected.append(int(vocab_ids[head.draft_logits(out).argmax()]))
            out = head.step(out[None], torch.tensor(expected[-1:]), cache)[-1]
    assert draft.token_ids == tuple(expected)


def test_sampling_draft_rows_are_zero_outside_the_reduced_vocabulary(tiny_models):
    target = tiny_models["llama"]
    vocab_ids = torch.arange(10, 200)
    drafter = HeadDrafter(random_head(target, vocab_ids), target.info.vocab_size, "h")
    prompt = Engine(target).encode("Once upon a time")
    logits, hidden = target_states(target, prompt, drafter.head)
    generator = torch.Generator().manual_seed(0)
    drafter.begin(prompt, SamplingParams(temperature=1.0), generator)
    drafter.observe_target(hidden)
    for _ in range(20):
        draft = drafter.propose(prompt + [int(logits.argmax())], 4)
        outside = torch.ones(target.info.vocab_size, dtype=torch.bool)
        outside[vocab_ids] = False
        assert draft.probs[:, outside].sum() == 0
        torch.testing.assert_close(draft.probs.sum(-1), torch.ones(4))
        assert all(10 <= token < 200 for token in draft.token_ids)


def test_sampled_head_drafts_follow_the_distribution_they_carry(tiny_models):
    """The rejection sampler trusts a draft's row as the law its token was drawn from: proposals from one context
    (the same row each time) must be distributed as that row says."""
    target = tiny_models["llama"]
    vocab_ids = torch.randperm(target.info.vocab_size, generator=torch.Generator().manual_seed(2))[:100]
    drafter = HeadDrafter(random_head(target, vocab_ids, seed=4), target.info.vocab_size, "h")
    prompt = Engine(target).encode("Once upon a time")
    logits, hidden = target_states(target, prompt, drafter.head)
    drafter.begin(prompt, SamplingParams(temperature=0.8, top_k=10), torch.Generator().manual_seed(5))
    drafter.observe_target(hidden)
    samples, counts, rows = 3000, Counter(), set()
    for _ in range(samples):
        draft = drafter.propose(prompt + [int(logits.argmax())], 1)
        counts[draft.token_ids[0]] += 1
        rows.add(tuple(draft.probs[0].tolist()))
    assert len(rows) == 1  # the same context gives the same row
    claimed = draft.probs[0]
    support = claimed.nonzero().flatten().tolist()
    assert set(counts) <= set(support)
    expected = (claimed[support].double() / claimed[support].double().sum() * samples).tolist()
    assert chisquare([counts[t] for t in support], expected).pvalue > 1e-3


def _first_token_counts(draft_probs, target_probs, samples, honest=True):
    """Output token of position 1 over many draft + rejection-sample rounds."""
    generator = torch.Generator().manual_seed(1)
    counts = Counter()
    proposals = set()
    for _ in range(samples):
        draft_token = torch.multinomial(draft_probs, 1, generator=generator)  # [1]
        proposals.add(int(draft_token))
        claimed = draft_probs[None] if honest else target_probs[None]  # dishonest: claims to be the target
        verdict = rejection_sample(draft_token, claimed, torch.stack([target_probs, target_probs]), generator)
        counts[verdict.tokens[0]] += 1
    return counts, proposals


def test_rejection_sampling_with_reduced_vocabulary_follows_the_target():
    torch.manual_seed(0)
    vocab, reduced = 8, torch.tensor([0, 1, 3, 5, 6])
    target_probs = torch.softmax(torch.randn(vocab), 0)  # mass everywhere, some outside the reduced vocabulary
    draft_logits = torch.full((vocab,), float("-inf"))
    draft_logits[reduced] = torch.randn(len(reduced)) * 2
    draft_probs = torch.softmax(draft_logits, 0)  # zero outside the reduced vocabulary
    samples = 6000
    counts, proposals = _first_token_counts(draft_probs, target_probs, samples)
    assert proposals <= set(reduced.tolist())
    observed = [counts[i] for i in range(vocab)]
    assert chisquare(observed, (target_probs.double() / target_probs.double().sum() * samples).tolist()).pvalue > 1e-3
    assert sum(counts[i] for i in range(vocab) if i not in reduced.tolist()) > 0  # out-of-vocab mass recovered
    dishonest, _ = _first_token_counts(draft_probs, target_probs, samples, honest=False)
    assert (
        chisquare(
            [dishonest[i] for i in range(vocab)],
            (target_probs.double() / target_probs.double().sum() * samples).tolist(),
        ).pvalue
        < 1e-6
    )


@pytest.mark.parametrize("inference", [False, True])
def test_head_drafter_with_sampling_and_the_verifier_follow_the_target(tiny_models, inference):
    """End to end at one position: head proposals (reduced vocabulary, sampled) + rejection sampling ~ target."""
    target = tiny_models["llama"]
    vocab_ids = torch.arange(0, target.info.vocab_size, 2)
    drafter = HeadDrafter(random_head(target, vocab_ids, inference=inference), target.info.vocab_size, "h")
    params = SamplingParams(temperature=0.7, top_k=12)
    prompt = Engine(target).encode("Once upon a time")
    logits, hidden = target_states(target, prompt, drafter.head)
    pending = int(logits.argmax())
    target_probs = sampling.warp(target.runner.forward([pending])[-1:], params)[0]  # [vocab] after the pending token
    generator = torch.Generator().manual_seed(3)
    drafter.begin(prompt, params, generator)
    drafter.observe_target(hidden)
    samples, counts, proposed = 4000, torch.zeros(target.info.vocab_size), set()
    for _ in range(samples):
        draft = drafter.propose(prompt + [pending], 1)
        proposed.add(draft.token_ids[0])
        verdict = rejection_sample(
            torch.tensor(draft.token_ids), draft.probs, torch.stack([target_probs] * 2), generator
        )
        counts[verdict.tokens[0]] += 1
    assert proposed <= set(vocab_ids.tolist())
    support = target_probs > 0
    assert counts[~support].sum() == 0
    expected = (target_probs[support].double() / target_probs[support].double().sum() * samples).tolist()
    assert chisquare(counts[support].tolist(), expected).pvalue > 1e-3


def test_loading_against_another_target_fails_clearly(tiny_models, tmp_path):
    target = tiny_models["llama"]
    head = random_head(target, torch.arange(50))
    save_head(tmp_path / "head", head, target_identity(target), verifier="llama", dtype=torch.float32)
    loaded = load_head(tmp_path / "head", target)
    assert all(torch.equal(loaded.state_dict()[name], t) for name, t in head.state_dict().items())
    assert loaded.vocab_ids.tolist() == list(range(50))
    with pytest.raises(UsageError, match="trained for target llama .*different weights"):
        load_head(tmp_path / "head", tiny_models["llama-other"])
    with pytest.raises(UsageError, match="trained for target llama .*architecture"):
        load_head(tmp_path / "head", tiny_models["gemma3"])


class RecordingHeadDrafter(HeadDrafter):
    """A head drafter whose forks append every proposal to one shared list."""

    def __init__(self, head, target_vocab_size, name, proposals):
        super().__init__(head, target_vocab_size, name)
        self.proposals = proposals

    def propose(self, context_ids, k):
        draft = super().propose(context_ids, k)
        self.proposals.append(draft.token_ids)
        return draft


def _drafts(target, directory, prompts=PROMPTS, k=4):
    """Greedy draft tokens of every step (and the outputs) of the head in `directory` on `prompts`."""
    loaded = HeadDrafter.from_argument(str(directory), target, DrafterLoadOptions())
    proposals = []
    engine = Engine(target, SpecConfig(drafter="h", k=k))
    engine.add_drafter("h", RecordingHeadDrafter(loaded.head, target.info.vocab_size, "h", proposals))
    outputs = [engine.generate(prompt, GREEDY).token_ids for prompt in prompts]
    return proposals, outputs


@pytest.mark.parametrize("layout", ["speculators", "eagle3"])
def test_an_exported_head_loads_back_and_drafts_the_same_tokens(tiny_models, tmp_path, layout):
    """export writes the layout other engines read; loading it back gives the same drafts token for token."""
    target = tiny_models["llama"]
    vocab_ids = torch.randperm(target.info.vocab_size, generator=torch.Generator().manual_seed(1))[:200]
    save_head(tmp_path / "head", random_head(target, vocab_ids), target_identity(target), verifier="tiny/llama")
    export(tmp_path / "head", tmp_path / layout, layout, target)
    config = json.loads((tmp_path / layout / "config.json").read_text())
    tensors = load_file(str(tmp_path / layout / "model.safetensors"))
    if layout == "speculators":
        assert config["speculators_model_type"] == "eagle3" and config["draft_vocab_size"] == 200
        assert config["eagle_aux_hidden_state_layer_ids"] == list(default_aux_layers(2))
        assert config["transformer_layer_config"]["num_hidden_layers"] == 1
        assert config["speculators_config"]["verifier"]["name_or_path"] == "tiny/llama"
        assert "layers.0.hidden_norm.weight" in tensors
    else:
        assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["draft_vocab_size"] == 200
        assert "midlayer.hidden_norm.weight" in tensors and not any(n.startswith("layers.") for n in tensors)
    assert torch.equal(tensors["d2t"] + torch.arange(200), vocab_ids)  # target id = draft id + d2t[draft id]
    assert tensors["t2d"].sum() == 200 and tensors["t2d"][vocab_ids].all()
    assert tensors["lm_head.weight"].shape == (200, 64) and tensors["fc.weight"].shape == (64, 3 * 64)
    assert _drafts(target, tmp_path / layout) == _drafts(target, tmp_path / "head")


def test_a_head_trained_elsewhere_loads_by_its_shapes_and_refuses_a_target_it_cannot_read(tiny_models, tmp_path):
    """No quickdraft.json: the config and tensors are all there is (an EAGLE-3 release, `model.` prefixes and an
    own embedding included); a target of another width or vocabulary is refused with the reason."""
    target = tiny_models["llama"]
    save_head(tmp_path / "ours", random_head(target), target_identity(target), verifier="llama", dtype=torch.float32)
    export(tmp_path / "ours", tmp_path / "foreign", "eagle3", target)
    (tmp_path / "foreign" / "quickdraft.json").unlink()
    tensors = load_file(str(tmp_path / "foreign" / "model.safetensors"))
    tensors = {("model." + n if n.startswith("midlayer.") else n): t for n, t in tensors.items()}
    tensors["embed_tokens.weight"] = torch.zeros(target.info.vocab_size, 64)
    save_file(tensors, str(tmp_path / "foreign" / "model.safetensors"))
    assert _drafts(target, tmp_path / "foreign")[1] == _drafts(target, tmp_path / "ours")[1]
    config = json.loads((tmp_path / "foreign" / "config.json").read_text())
    for change, reason in (
        ({"vocab_size": 999}, "a vocabulary of 320, the head's is 999"),
        ({"target_hidden_size": 32}, "hidden size 64, the head reads 32"),
        ({"fc_norm": True}, "fc_norm is not supported"),
    ):
        (tmp_path / "foreign" / "config.json").write_text(json.dumps({**config, **change}))
        with pytest.raises(UsageError, match=reason):
            load_head(tmp_path / "foreign", target)


def test_an_exported_head_refuses_another_target_of_the_same_shapes(tiny_models, tmp_path):
    target = tiny_models["llama"]
    save_head(tmp_path / "head", random_head(target), target_identity(target), verifier="llama")
    export(tmp_path / "head", tmp_path / "out", "speculators", target)
    with pytest.raises(UsageError, match="trained for target llama .*different weights"):
        load_head(tmp_path / "out", tiny_models["llama-other"])
    with pytest.raises(UsageError, match="trained for target llama .*different weights"):
        export(tmp_path / "head", tmp_path / "other", "eagle3", tiny_models["llama-other"])


def test_head_drafter_from_a_directory_through_the_engine(tiny_models, tmp_path):
    target = tiny_models["llama"]
    save_head(tmp_path / "head", random_head(target), target_identity(target), verifier="llama")
    engine = Engine(target, SpecConfig(drafter=f"head:{tmp_path / 'head'}", k=3))
    expected = Engine(target, SpecConfig(drafter="none")).generate("Once upon a time", GREEDY)
    assert engine.generate("Once upon a time", GREEDY).token_ids == expected.token_ids
    with pytest.raises(UsageError, match="no draft head"):
        Engine(target, SpecConfig(drafter=f"head:{tmp_path / 'missing'}")).drafter(f"head:{tmp_path / 'missing'}")
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert config["transformer_layer_config"]["vocab_size"] == target.info.vocab_size


def test_a_shipped_head_drafts_only_when_asked(tiny_models, tiny_dirs, tmp_path, monkeypatch):
    """The default drafter is n-gram lookup even for a target that has a head shipped for its very weights
    (BENCHMARKS.md, "Speculation under load": the head cost more than it added); `head` asks for it."""
    monkeypatch.setattr(head_drafters, "SHIPPED_HEADS", tmp_path)
    llama = tiny_models["llama"]
    save_head(tmp_path / "llama", random_head(llama), target_identity(llama), verifier="llama")
    assert Engine.from_names(str(tiny_dirs["llama"]), runtime="hf").spec.drafter == "ngram"
    engine = Engine.from_names(str(tiny_dirs["llama"]), runtime="hf", drafter="ngram,head")
    expected = Engine(llama, SpecConfig(drafter="none")).generate("Once upon a time", GREEDY)
    assert engine.generate("Once upon a time", GREEDY).token_ids == expected.token_ids


@pytest.mark.real_model
def test_shipped_head_loads_against_its_target_and_refuses_another(builtin_model_dir):
    from quickdraft.models.loading import load_model_dir

    target = load_model_dir(builtin_model_dir("smollm2-135m-instruct"), runtime="hf", name="smollm2-135m-instruct")
    engine = Engine(target, SpecConfig(drafter="head", k=4))
    prompt = engine.encode("Name three primary colours.", chat=True)
    params = SamplingParams(max_new_tokens=32)
    result = engine.generate(prompt, params)
    assert result.token_ids == engine.generate(prompt, params, spec=engine.spec_with(drafter="none")).token_ids
    assert result.stats.accepted_tokens > 0
    other = load_model_dir(builtin_model_dir("gemma-3-270m"), runtime="hf", name="gemma-3-270m")
    with pytest.raises(UsageError, match="trained for target smollm2-135m-instruct"):
        Engine(other, SpecConfig(drafter="head:smollm2-135m-instruct")).drafter("head:smollm2-135m-instruct")


@pytest.mark.real_model
def test_generate_drafts_with_ngram_and_the_shipped_head_when_asked(builtin_model_dir):
    """`quickdraft generate --drafter ngram,head` on the built-in model: both drafters under k=auto, output
    unchanged."""
    builtin_model_dir("smollm2-135m-instruct")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "quickdraft",
            "generate",
            "--drafter",
            "ngram,head",
            "--chat",
            "--json",
            "--compare",
            "--max-new-tokens",
            "32",
            "--threads",
            "1",
            "Write two sentences about a lighthouse keeper.",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert (report["drafter"], report["k"]) == ("ngram,head", "auto")
    assert report["identical"] is True


def test_cost_ratio_times_drafts_of_any_length_as_the_drafter_feeds_them(tiny_models):
    """c per drafted token, for one-token drafts (the cards' c) and four-token ones: each draft starts at the same
    cache position, after the context's pairs, and each later step takes the previous step's output as its stream
    and its best draft token, mapped to a target id, as the drafter feeds them."""
    target = tiny_models["llama"]
    head = random_head(target, vocab_ids=torch.arange(1, target.info.vocab_size, 2), inference=True)
    calls, step = [], head.step

    def recording_step(stream, next_tokens, cache):
        calls.append((cache.length, stream, next_tokens))
        out = step(stream, next_tokens, cache)
        calls[-1] += (out,)
        return out

    head.step = recording_step
    for length in (1, 4):
        calls.clear()
        c = cost_ratio(target, head, length)
        assert 0 < c < float("inf")
        drafts = [calls[i : i + length] for i in range(1, len(calls), length)]  # calls[0]: the context's pairs
        assert len(drafts) > 1 and all(len(draft) == length for draft in drafts)
        assert {draft[0][0] for draft in drafts} == {calls[0][0] + calls[0][1].shape[0]}
        for draft in drafts:
            for before, after in zip(draft, draft[1:]):
                assert after[0] == before[0] + 1 and torch.equal(after[1], before[3][-1:])
                assert int(after[2]) == int(head.vocab_ids[int(head.draft_logits(before[3][-1]).argmax())])
