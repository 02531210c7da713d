"""One running request of the engine: its own drafters, controller, generator, KV cache slot and output.

The engine builds one `RunningRequest` per admitted request and, every step, asks each for its part
of the batched target forward (`prefill_part` while its prompt is being read, `decode_part` after),
then hands back what the forward returned (`take_prefill`, `take_verification`). Everything that
makes a request's output its own lives here, so a request's tokens depend on nothing else in the batch.
"""

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import torch

from quickdraft import sampling
from quickdraft.config import SamplingParams
from quickdraft.controller import BatchLoad, Controller, Plan
from quickdraft.drafters.base import Draft, Drafter
from quickdraft.models.base import PREFILL_BLOCK, SequenceOutput, SequenceStep
from quickdraft.output import TARGET, Event, Failed, RequestOutput
from quickdraft.stats import GenerationStats
from quickdraft.verify import Verdict, greedy_verify, rejection_sample


@dataclass(frozen=True)
class DecodePlan:
    """What a decoding request feeds this step, and how it got there."""

    plan: Plan
    draft: Draft
    draft_seconds: float


class RunningRequest:
    """A request between admission and its last event."""

    def __init__(
        self,
        request_id: int,
        output: RequestOutput,
        params: SamplingParams,
        drafters: dict[str, Drafter],
        controller: Controller,
        clock: Callable[[], float],
        submitted: float,
        device: torch.device,
    ) -> None:
        self.request_id = request_id
        self.output = output
        self.params = params
        self.drafters = drafters  # this request's own instances, by name (`Drafter.fork`)
        self.controller = controller
        self.generator = sampling.make_generator(params.seed, device)
        self.hidden_readers = [d for d in drafters.values() if d.target_layers]
        # the union of the states they read, in one forward; each reader gets its own columns
        self.hidden_layers = tuple(sorted({layer for d in self.hidden_readers for layer in d.target_layers}))
        self.stats = GenerationStats(prompt_tokens=len(output.prompt_ids))
        self.events: deque[Event] = deque()
        self.slot: int | None = None
        self.prefilled = 0  # prompt tokens in the target's cache
        self.prefill_steps = 0  # engine steps run while this request's prompt was not all in the cache
        self._clock = clock
        self._submitted = submitted
        for drafter in drafters.values():
            drafter.begin(output.prompt_ids, params, self.generator)

    @property
    def prefilling(self) -> bool:
        return self.prefilled < len(self.output.prompt_ids)

    @property
    def done(self) -> bool:
        return self.output.finish_reason is not None

    def prefill_rank(self, step_tokens: int) -> int:
        """This request's place in a step's prefill order, lowest first: its prompt tokens not yet in the cache,
        less `step_tokens` for every step it has been prefilling. Short prompts go first (their first token
        does not wait for a long prompt's whole prefill), and a long one waits a bounded number of steps
        behind later, shorter ones."""
        return len(self.output.prompt_ids) - self.prefilled - step_tokens * self.prefill_steps

    def prefill_part(self, budget: int) -> SequenceStep:
        """The next chunk of the prompt: about `budget` tokens, ending at a PREFILL_BLOCK boundary unless it
        ends the prompt (so the cache is the same however the load cut the prompt), at least one block; logits
        only with the prompt's last token."""
        prompt = self.output.prompt_ids
        end = min(len(prompt), self.prefilled + budget)
        if end < len(prompt):
            end = max(end // PREFILL_BLOCK, self.prefilled // PREFILL_BLOCK + 1) * PREFILL_BLOCK
            end = min(end, len(prompt))
        chunk = tuple(prompt[self.prefilled : end])
        last = end == len(prompt)
        return SequenceStep(self.slot, chunk, "last" if last else "none", self.hidden_layers)

    def take_prefill(self, part: SequenceStep, out: SequenceOutput) -> None:
        self._hand_states(out.hidden)
        self.prefilled += len(part.token_ids)
        if self.prefilling:
            return
        first = sampling.choose(out.logits, self.params, self.generator)  # [1]
        self.stats.target_forwards = 1
        self.output.commit((int(first),))
        self.stats.prefill_seconds = self._clock() - self._submitted
        self.events.extend(self.output.deltas())

    def plan(self, load: BatchLoad) -> DecodePlan:
        """This step's drafter and draft, priced against the rest of the batch (`load`)."""
        started = self._clock()
        plan = self.controller.plan(self.output.context, self.output.remaining - 1, load)
        planned = self._clock()
        draft = self._draft(plan)
        drafted = self._clock()
        self.stats.draft_seconds += drafted - started
        return DecodePlan(plan, draft, drafted - planned)

    def decode_part(self, decode: DecodePlan) -> SequenceStep:
        """The pending token and the draft, every row's logits (and states for a drafter that reads them)."""
        token_ids = (self.output.pending, *decode.draft.token_ids)
        return SequenceStep(self.slot, token_ids, "all", self.hidden_layers)

    def take_verification(
        self, decode: DecodePlan, out: SequenceOutput, committed_length: int, greedy_ids: list[int] | None
    ) -> int:
        """Verify the draft against the target's rows; returns the slot length to roll back to. `greedy_ids`: the
        argmax of each of out's logit rows when the request is greedy (the engine takes every greedy request's of
        a step in one kernel call), else None."""
        verdict = _verify(decode.draft, out.logits, greedy_ids, self.params, self.generator)
        self.controller.observe(decode.plan, decode.draft, verdict, decode.draft_seconds)
        self._hand_states(out.hidden, verdict.num_accepted + 1)  # the states of the committed positions
        self.stats.record_step(len(decode.draft), verdict.num_accepted, decode.plan.drafter or "none")
        accepted = (decode.plan.drafter,) * verdict.num_accepted  # proposed by this step's drafter
        self.output.commit(verdict.tokens, (*accepted, TARGET))
        self.events.extend(self.output.deltas())
        return committed_length + 1 + verdict.num_accepted

    def finish(self) -> None:
        """The last event: `Finished` with the stats."""
        self.controller.finish()
        self.stats.generated_tokens = len(self.output.generated)
        self.stats.total_seconds = self._clock() - self._submitted
        self.events.append(self.output.finished(self.stats))

    def _hand_states(self, hidden: torch.Tensor | None, rows: int | None = None) -> None:
        """Each state reader gets its layers' columns of the first `rows` rows (default all) of `hidden`
        [n, len(self.hidden_layers) * d]."""
        if not self.hidden_readers:
            return
        per_layer = hidden[:rows].chunk(len(self.hidden_layers), dim=-1)  # each [rows, d]
        for reader in self.hidden_readers:
            reader.observe_target(torch.cat([per_layer[self.hidden_layers.index(i)] for i in reader.target_layers], -1))

    def fail(self, error: Exception) -> None:
        self.events.append(Failed(error))

    def _draft(self, plan: Plan) -> Draft:
        """The plan's k tokens: cut from a lookup already made, or proposed now."""
        if plan.k == 0 or plan.drafter is None:
            return Draft(token_ids=())
        if plan.drafter in plan.lookups:
            return plan.lookups[plan.drafter].truncated(plan.k)
        return self.drafters[plan.drafter].propose(self.output.context, plan.k)


def _verify(
    draft: Draft,
    target_logits: torch.Tensor,
    greedy_ids: list[int] | None,
    params: SamplingParams,
    generator: torch.Generator,
) -> Verdict:
    if params.greedy:
        return greedy_verify(draft.token_ids, greedy_ids)
    draft_ids = torch.tensor(draft.token_ids, dtype=torch.long, device=target_logits.device)  # [k]
    return rejection_sample(draft_ids, draft.probs, sampling.WarpedRows(target_logits, params), generator)
