"""Choosing, each step, which drafter to use and how many tokens to draft (k = 0: plain decoding).

The decision rule (`choose`) is a pure function of numbers. For drafter d and k draft tokens,
with conditional acceptance a_1..a_k by position, drafting cost c_d per token and target step
time t(n) over n fed tokens:

    E(d, k) = 1 + sum_{i<=k} prod_{j<=i} a_j        expected tokens the step yields
    T(d, k) = k * c_d + t(k + 1)                     expected seconds it takes     (k = 0: 1, t(1))

and the step takes the (d, k) with the largest E / T, tokens per second; plain decoding, 1 / t(1),
is always on offer, so drafting is chosen only where it is expected to pay.

In a batch, one forward serves every running request, so a request prices its draft by what it adds
to the whole step (`BatchLoad`): with the others feeding R rows and expected to yield E' tokens, it
takes the (d, k) with the largest (E' + E(d, k)) / (k * c_d + t(R + k + 1)). Alone (R = 0, E' = 0) this
is the rule above; under load the extra rows of a draft cost the batch's marginal row price, so
speculation backs off as the batch fills and comes back as it empties. Requests still reading their prompt
count as decoding ones in the rate a draft must beat (`step_price`): a prompt chunk's seconds, which yield
nothing now, would otherwise make any draft look worth its rows. This is the speedup of
`docs/cost_model.md` with two refinements: acceptance by position instead of one rate (an n-gram proposal that
starts right tends to stay right), and t(n) measured per size rather than assumed to grow (on CPU
some sizes run faster kernels). A renewal-reward variant (maximise E - rho * T with rho the
request's measured speed, better in theory when steps differ) was tried on recorded outputs and
did no better: rho lags behind the text and overreacts after long copied spans.

Acceptance is learnt per drafter and per `Draft.source` (for n-gram, the length of the matched
suffix: a 4-gram match is far more reliable than a 1-gram one). A lookup drafter (n-gram)
proposes before the decision: its proposal costs only the lookup, so its k is capped by the
proposal's length, its drafting cost is 0, and its acceptance is learnt at every step from the
proposal whether or not it was verified (`acceptance.outcomes`). A model drafter is only observed
when it drafts; once the controller stops using it, exploration credit (EXPLORATION_BUDGET tokens
per token produced) accumulates, and when the credit covers the expected loss of a 1-token probe,
the step drafts 1 token with it. The loss, in tokens, is what the best choice would have produced
in the probe's time, minus what the probe is expected to produce; the probe's time includes the
drafter catching up on the text produced since it last drafted (its cache lags). Probing thus
costs about EXPLORATION_BUDGET of the output's worth of time, and a drafter that has become good
is found again as long as catching up is cheap enough to fit that budget. A regular (non-probe)
choice does not count catch-up: starting to use a drafter pays it once and the rule judges the
steps that follow.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from quickdraft.acceptance import AcceptanceEstimate, outcomes
from quickdraft.costs import DraftCost, TargetCost, expected_tokens
from quickdraft.drafters.base import Draft, Drafter
from quickdraft.verify import Verdict

EXPLORATION_BUDGET = 0.02  # expected tokens a probe may lose, per token produced


@dataclass(frozen=True)
class DraftOption:
    """One drafter the step could use, as the decision rule sees it."""

    name: str
    acceptance: tuple[float, ...]  # [most tokens it may draft now]: P(token i accepted | tokens before it accepted)
    seconds_per_token: float  # drafting cost per token; 0 when the proposal is already made (a lookup)


@dataclass(frozen=True)
class Choice:
    """What one step does, and what it is expected to yield."""

    drafter: str | None  # None: plain decoding
    k: int  # tokens to draft; 0 exactly when drafter is None
    tokens: float  # E: expected tokens
    seconds: float  # T: expected seconds

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds


@dataclass(frozen=True)
class BatchLoad:
    """The rest of a step's batch, as one request plans its part of it."""

    rows: int = 0  # tokens the other sequences feed (prompt chunks included)
    sequences: int = 0  # other sequences in the forward (prefilling ones included)
    tokens: float = 0.0  # tokens the other sequences are expected to yield
    prompt_rows: int = 0  # of `rows`, the prompt chunks' tokens
    prompt_sequences: int = 0  # of `sequences`, the ones reading a prompt chunk
    prefilling: int = 0  # running requests still reading their prompt, with a chunk in this step or not


ALONE = BatchLoad()


def step_price(target: TargetCost, load: BatchLoad, limit: int) -> tuple[list[float], float]:
    """What one request's draft is priced against: ([limit + 1] the step's seconds when the request feeds 1, 2, ...
    tokens, the tokens the rest of the step yields).

    A prompt chunk is work the batch does whatever the decoding requests draft. It prices a draft's rows (the
    step's marginal cost, t(rows + n) - t(rows + 1): behind a chunk, a batch is past its cheap sizes), but the
    rate a draft must beat is that of the step in which every running request decodes: each prefilling one,
    whether or not its chunk is in this step, feeds one row and yields one token. Otherwise a chunk's seconds,
    yielding nothing, would make any draft look worth its rows, and the time a draft takes delays the prompts
    that would soon decode too. Without prefilling requests this is (t(rows + n), load.tokens).
    """
    with_prompts = target.seconds_from(load.rows + 1, limit + 1, load.sequences + 1)
    if not load.prefilling:
        return with_prompts, load.tokens
    decoding_rows = load.rows - load.prompt_rows + load.prefilling
    decoding_sequences = load.sequences - load.prompt_sequences + load.prefilling
    base = target.seconds(decoding_rows + 1, decoding_sequences + 1)
    return [base + seconds - with_prompts[0] for seconds in with_prompts], load.tokens + load.prefilling


def estimate(option: DraftOption, k: int, target_seconds: Sequence[float], base_tokens: float = 0.0) -> Choice:
    """E and T of drafting k tokens with `option` (plus the batch's `base_tokens`); target_seconds[n - 1] is t(n)."""
    seconds = k * option.seconds_per_token + target_seconds[k]
    return Choice(option.name, k, base_tokens + expected_tokens(option.acceptance, k), seconds)


def choose(options: Sequence[DraftOption], target_seconds: Sequence[float], base_tokens: float = 0.0) -> Choice:
    """The (drafter, k) with the most expected tokens per second; plain decoding wins ties.

    target_seconds: [k_limit + 1] the step's seconds when this request feeds 1, 2, ... tokens: k is at most
    len(target_seconds) - 1. base_tokens: what the rest of the batch is expected to yield in the same step.
    """
    best = (None, 0, 1.0 + base_tokens, target_seconds[0])  # (drafter, k, E, T), no objects: this runs every step
    best_rate = best[2] / target_seconds[0]
    for option in options:
        tokens, all_accepted = 1.0 + base_tokens, 1.0
        for k in range(1, min(len(option.acceptance), len(target_seconds) - 1) + 1):
            all_accepted *= option.acceptance[k - 1]
            tokens += all_accepted
            seconds = k * option.seconds_per_token + target_seconds[k]
            if tokens / seconds > best_rate:
                best, best_rate = (option.name, k, tokens, seconds), tokens / seconds
    return Choice(*best)


@dataclass(frozen=True)
class Plan:
    """A step's decision, with what was done to reach it."""

    drafter: str | None  # the drafter to draft with; None: plain decoding
    k: int  # tokens to draft (a lookup's proposal is cut to k)
    lookups: Mapping[str, Draft] = field(default_factory=dict)  # proposals made before deciding, by drafter name
    tokens: float = 1.0  # tokens the step is expected to yield for this request (E), as the controller judged


class Controller(Protocol):
    """Plans each step of one request and learns from its outcome."""

    def plan(self, context: list[int], limit: int, load: BatchLoad = ALONE) -> Plan:
        """The step's drafter and k (k <= limit), given the committed context and the rest of the batch."""

    def observe(self, plan: Plan, draft: Draft, verdict: Verdict, draft_seconds: float) -> None:
        """What the step drafted, what the target produced, and how long drafting took (the engine times the
        target's forward, which the whole batch shares, into `ControllerMemory.target`)."""

    def finish(self) -> None:
        """The request has ended."""


class FixedController:
    """A fixed k with one drafter: every step drafts up to k tokens."""

    def __init__(self, drafter: str, k: int) -> None:
        self.drafter = drafter
        self.k = k

    def plan(self, context: list[int], limit: int, load: BatchLoad = ALONE) -> Plan:
        return Plan(self.drafter, min(self.k, limit))

    def observe(self, plan: Plan, draft: Draft, verdict: Verdict, draft_seconds: float) -> None:
        pass

    def finish(self) -> None:
        pass


@dataclass
class ControllerMemory:
    """What an engine has measured, shared by its requests: costs, and acceptance carried to the next request.

    Model drafters' costs are kept relative to the target's current scale: a load change that
    slows the target slows the draft model alike, even while the draft model is not being used.
    """

    target: TargetCost
    draft_costs: dict[str, DraftCost] = field(default_factory=dict)  # model drafters, by name; at target scale 1
    acceptance: dict[tuple[str, str], tuple[float, ...]] = field(default_factory=dict)  # by (drafter, source)

    def add_draft_cost(self, drafter: str, measured: DraftCost) -> None:
        """A drafter's costs measured now, in seconds."""
        scale = self.target.scale
        self.draft_costs[drafter] = DraftCost(
            measured.seconds_per_token / scale, measured.seconds_per_catch_up_token / scale
        )

    def draft_seconds(self, drafter: str, tokens: int, behind: int = 0) -> float:
        """Seconds to draft `tokens` tokens, `behind` tokens after the drafter's last proposal."""
        cost = self.draft_costs[drafter]
        return self.target.scale * (tokens * cost.seconds_per_token + behind * cost.seconds_per_catch_up_token)

    def observe_draft(self, drafter: str, tokens: int, behind: int, seconds: float) -> None:
        self.draft_costs[drafter].observe(tokens, behind, seconds / self.target.scale)


class AdaptiveController:
    """Chooses the drafter and k of every step of one request (see the module docstring)."""

    def __init__(self, drafters: Mapping[str, Drafter], memory: ControllerMemory, k_max: int) -> None:
        self._drafters = dict(drafters)
        self._memory = memory
        self._k_max = k_max
        self._estimates: dict[tuple[str, str], AcceptanceEstimate] = {}  # by (drafter, Draft.source)
        self._credit = {name: 0.0 for name, drafter in drafters.items() if not drafter.lookup_only}  # model drafters
        self._fed = dict.fromkeys(self._credit, 0)  # context length each model drafter has caught up to
        self._context_length = 0  # of the step being planned

    def plan(self, context: list[int], limit: int, load: BatchLoad = ALONE) -> Plan:
        limit = min(limit, self._k_max)
        if limit < 1:
            return Plan(None, 0)
        self._context_length = len(context)
        lookups = {name: d.propose(context, limit) for name, d in self._drafters.items() if d.lookup_only}
        target_seconds, base_tokens = step_price(self._memory.target, load, limit)  # [limit + 1], E'
        usable = [name for name in self._drafters if name not in lookups or len(lookups[name])]  # lookups that matched
        options = [self._option(name, lookups, limit) for name in usable]
        choice = self._explore(choose(options, target_seconds, base_tokens), options, target_seconds, base_tokens)
        return Plan(choice.drafter, choice.k, lookups, choice.tokens - base_tokens)

    def observe(self, plan: Plan, draft: Draft, verdict: Verdict, draft_seconds: float) -> None:
        produced = verdict.tokens
        for name, proposal in plan.lookups.items():
            self._estimate(name, proposal.source).observe(outcomes(proposal.token_ids, produced))
        if plan.drafter in self._credit and len(draft):
            self._estimate(plan.drafter, draft.source).observe(outcomes(draft.token_ids, produced))
            self._memory.observe_draft(plan.drafter, len(draft), self._behind(plan.drafter), draft_seconds)
            self._fed[plan.drafter] = self._context_length + len(produced) - 1  # its cache holds the accepted draft
        for name in self._credit:
            self._credit[name] = (
                0.0 if name == plan.drafter else self._credit[name] + EXPLORATION_BUDGET * len(produced)
            )

    def finish(self) -> None:
        self._memory.acceptance.update({key: tuple(estimate.means()) for key, estimate in self._estimates.items()})

    def _estimate(self, drafter: str, source: str) -> AcceptanceEstimate:
        key = (drafter, source)
        if key not in self._estimates:
            self._estimates[key] = AcceptanceEstimate(self._k_max, self._memory.acceptance.get(key, ()))
        return self._estimates[key]

    def _behind(self, drafter: str) -> int:
        """Tokens of context the model drafter has to catch up on before proposing."""
        return self._context_length - self._fed[drafter]

    def _option(self, name: str, lookups: Mapping[str, Draft], limit: int) -> DraftOption:
        proposal = lookups.get(name)
        if proposal is None:
            cost = self._memory.draft_seconds(name, 1)
            return DraftOption(name, tuple(self._estimate(name, "").means()[:limit]), cost)
        return DraftOption(name, tuple(self._estimate(name, proposal.source).means()[: len(proposal)]), 0.0)

    def _explore(
        self, choice: Choice, options: list[DraftOption], target_seconds: list[float], base_tokens: float
    ) -> Choice:
        """A 1-token probe of a model drafter instead, when its credit covers the probe's expected loss."""
        for option in options:
            if option.name in self._credit and option.name != choice.drafter:
                probe = estimate(option, 1, target_seconds, base_tokens)
                catch_up = self._memory.draft_seconds(option.name, 0, self._behind(option.name))
                loss = choice.rate * (probe.seconds + catch_up) - probe.tokens  # tokens the best choice would add
                if self._credit[option.name] >= loss:
                    self._credit[option.name] -= loss
                    return probe
        return choice
