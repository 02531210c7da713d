"""Measuring a head: teacher-forced held-out metrics of an untrained head, engine runs, cost ratio.

`engine_metrics` answers prompts greedily with the engine, once with the head drafter and once
with the target alone, interleaved in the same process (`measure.interleave`): acceptance (alpha),
tau (tokens per target forward), acceptance by position, speedup, and whether every output is
identical. `cost_ratio` is c: the median time of one head drafting step (one pair through the head
plus its reduced output layer) over the median time of a one-token target forward, measured interleaved; with a
draft length k, per token of a k-token draft.
"""

import statistics
import time
from pathlib import Path

import torch

from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.distill.train import HELDOUT_EVERY, Example, TrainConfig, evaluate
from quickdraft.drafters.head.files import build_head
from quickdraft.drafters.head.inference import InferenceHead
from quickdraft.drafters.head.model import DraftHead, HeadCache, HeadConfig
from quickdraft.engine import Engine
from quickdraft.errors import UsageError
from quickdraft.measure import interleave, measure
from quickdraft.models.loading import LoadedModel
from quickdraft.stats import acceptance_rate, tau

COST_REPEATS = 100  # interleaved timings of each (cards read c 0.109-0.113 where benchmarks measured 0.079-0.095)
COST_CONTEXT = 64
HEAD, TARGET = "head", "target"  # the two methods `engine_metrics` interleaves


def heldout_prompts(prompts: list[str], count: int) -> list[str]:
    """The first `count` prompts of the held-out split (never trained on)."""
    return [p for i, p in enumerate(prompts) if i % HELDOUT_EVERY == 0][:count]


def untrained_metrics(
    target: LoadedModel, shapes: HeadConfig, vocab_ids: torch.Tensor, heldout: list[Example], config: TrainConfig
) -> dict:
    """Held-out metrics of a freshly initialised head: the baseline training must beat."""
    torch.manual_seed(config.seed)
    head = build_head(shapes, target, vocab_ids)
    _, output = target.runner.embedding_matrices()
    return evaluate(head, output, heldout, config)


def engine_metrics(target: LoadedModel, head_dir: Path, prompts: list[str], max_new_tokens: int, k: int = 4) -> dict:
    """Greedy generation with the saved head (k drafts) and with the target alone on `prompts`, interleaved."""
    engine = Engine(target, SpecConfig(drafter=f"head:{head_dir}", k=k))
    specs = {HEAD: engine.spec, TARGET: engine.spec_with(drafter="none")}
    params = SamplingParams(max_new_tokens=max_new_tokens)
    chat = bool(target.tokenizer.chat_template)
    encoded = [engine.encode(prompt, chat=chat) for prompt in prompts]
    trials = interleave(
        list(specs),
        ["heldout"] * len(prompts),
        1,
        lambda method, index, _: measure(engine, encoded[index], params, specs[method]),
    )
    runs = {method: [t.generation for t in trials if t.method == method] for method in specs}
    head, alone = runs[HEAD], runs[TARGET]
    drafted, accepted, steps = (sum(getattr(g, n) for g in head) for n in ("draft_tokens", "accepted_tokens", "steps"))
    by_position = torch.zeros(k)
    for g in head:
        by_position[: len(g.accepted_by_position)] += torch.tensor(g.accepted_by_position, dtype=torch.float)
    outputs = {(t.prompt, t.method): t.generation.token_ids for t in trials}
    return {
        "prompts": len(prompts),
        "k": k,
        "generated_tokens": sum(g.new_tokens for g in head),
        "alpha": round(acceptance_rate(accepted, drafted) or 0.0, 4),
        "tau": round(tau(accepted, steps), 4),
        "accepted_per_step_by_position": [round(float(a) / max(steps, 1), 4) for a in by_position],
        "speedup": round(sum(g.wall_seconds for g in alone) / max(sum(g.wall_seconds for g in head), 1e-9), 3),
        "identical": all(outputs[i, HEAD] == outputs[i, TARGET] for i in range(len(prompts))),
        "cost_ratio": round(cost_ratio(target, engine.drafter(engine.spec.drafter).head), 4),
    }


@torch.inference_mode()
def cost_ratio(target: LoadedModel, head: DraftHead | InferenceHead, draft_length: int = 1) -> float:
    """c: median time per token of a head drafting `draft_length` tokens in a row (each step fed the last one's
    output and greedy token, as the drafter feeds it) / median time of a one-token target forward, interleaved. Every
    draft starts after a target forward, as in the engine, which evicts much of the head's weights from the
    caches: the first step is the dearest, so c at draft_length 1 (the cards' c) bounds the cost per drafted token
    of longer drafts from above."""
    if draft_length < 1:
        raise UsageError(f"a draft length of {draft_length}: give 1 or more tokens")
    runner = target.runner
    context = [int(t) for t in head.vocab_ids[:COST_CONTEXT].tolist()]
    _, hidden = runner.prefill(context, hidden_layers=head.config.aux_layers)  # [COST_CONTEXT, 3 * d]
    cache = HeadCache()
    head.step(head.fuse(hidden[:-1]), torch.tensor(context[1:]), cache)
    state, token = head.fuse(hidden[-1:]), torch.tensor([context[0]])
    head_times, target_times = [], []
    for _ in range(COST_REPEATS):
        started = time.perf_counter()
        stream, next_token = state, token  # [1, d], [1]
        for _ in range(draft_length):
            out = head.step(stream, next_token, cache)[-1]  # [d]
            stream, next_token = out[None], head.vocab_ids[int(head.draft_logits(out).argmax())][None]
        head_times.append((time.perf_counter() - started) / draft_length)
        cache.length -= draft_length
        started = time.perf_counter()
        runner.forward(context[:1])
        target_times.append(time.perf_counter() - started)
        runner.rollback(COST_CONTEXT)
    return statistics.median(head_times) / statistics.median(target_times)
