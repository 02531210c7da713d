"""Replaying speculation on a recorded greedy output: the draft sizes a policy chooses, step by step.

Measured tokens/s on a shared machine swings by 10-20% between runs of identical work, which can
be as large as the differences between `--k auto` and the best fixed k. A replay takes timing
out: the target's greedy output (recorded by `quickdraft bench-adaptive`) is decoded again with
the real n-gram drafter and either a fixed k or the real adaptive controller, and a draft token is
accepted exactly when it equals the recorded token, which is what greedy verification does. The
controller is told that a step over n tokens took v(n) (a cost model, in units of t(1)), so its
choices follow that model alone. `scripts/replay_controller.py` prices the steps and compares
policies per category.
"""

from collections.abc import Sequence

from quickdraft.config import SpecConfig
from quickdraft.controller import AdaptiveController, ControllerMemory
from quickdraft.drafters.base import Draft
from quickdraft.drafters.ngram import NgramDrafter
from quickdraft.verify import Verdict


def replay(
    prompt_ids: list[int],
    output: Sequence[int],
    k: int | None,
    memory: ControllerMemory,
    spec: SpecConfig = SpecConfig(),
) -> list[int]:
    """Draft tokens per step (as `GenerationStats.k_per_step`) of decoding `output` after `prompt_ids`.

    k: a fixed k, or None for the adaptive controller (its costs and carried acceptance in
    `memory`, whose target cost model also prices every step it observes). As in the engine, the
    first output token comes from the prefill and a step never drafts past the last output token.
    """
    ngram = NgramDrafter()
    controller = AdaptiveController({"ngram": ngram}, memory, spec.k_max) if k is None else None
    position, steps = 1, []
    while position < len(output):
        context = list(prompt_ids) + list(output[:position])
        limit = len(output) - position - 1  # the engine's request.remaining - 1
        if controller is None:
            draft = ngram.propose(context, min(k, limit))
        else:
            plan = controller.plan(context, limit)
            draft = plan.lookups["ngram"].truncated(plan.k) if plan.drafter else Draft(token_ids=())
        accepted = 0
        while accepted < len(draft) and draft.token_ids[accepted] == output[position + accepted]:
            accepted += 1
        tokens = tuple(output[position : position + accepted + 1])
        if controller is not None:
            controller.observe(plan, draft, Verdict(accepted, tokens), 0.0, memory.target.seconds(len(draft) + 1))
        steps.append(len(draft))
        position += len(tokens)
    if controller is not None:
        controller.finish()
    return steps
