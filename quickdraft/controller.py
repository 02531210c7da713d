"""Choosing, each step, which drafter to use and how many tokens to draft (k = 0: plain decoding).

The decision rule (`choose`) is a pure function of numbers. For drafter d and k draft tokens,
with conditional acceptance a_1..a_k by position, drafting cost c_d per token and target step
time t(n) over n fed tokens:

    E(d, k) = 1 + sum_{i<=k} prod_{j<=i} a_j        expected tokens the step yields
    T(d, k) = k * c_d + t(k + 1)                     expected seconds it takes     (k = 0: 1, t(1))

A generation is a sequence of steps, so its speed is sum(tokens) / sum(seconds). Renewal-reward
theory (Dinkelbach's method for ratio objectives) says the speed is maximised by choosing, every
step, the option with the largest E - rho * T, where rho is the speed the policy achieves. Steps
are not alike (an n-gram lookup finds a long match, a short one or none), and this rule is what
makes the difference: a step whose extra tokens cost more time than they would take at the
generation's own speed is not worth drafting, even if its own ratio E / T beats plain decoding.
When every step offers the same options it picks exactly the k that maximises E / T. The
controller uses rho = its speed over the request's recent steps (tokens produced over the time the
cost model gives their choices, so rho is in the model's units and free of timing noise; at the
first step the best E / T on offer), never below plain decoding's 1 / t(1), reachable by any policy.

A lookup drafter (n-gram) proposes before the decision: its proposal costs only the lookup, so
its k is capped by the proposal's length, its drafting cost is 0, and its acceptance is learnt at
every step from the proposal whether or not it was verified (`acceptance.outcomes`). A model
drafter is only observed when it drafts; once the controller stops using it, exploration credit
(EXPLORATION_BUDGET tokens per token produced) accumulates, and when the credit covers the
expected loss of a 1-token probe, the step drafts 1 token with it. The loss counts the time the
drafter needs to catch up on the text produced since it last drafted (its cache lags). Probing
therefore costs at most about EXPLORATION_BUDGET of the output's worth of time, yet a drafter
that has become good is found again, as long as catching up is cheap enough to fit the budget.
A regular (non-probe) choice does not count catch-up: starting to use a drafter pays it once and
the rule judges the steps that follow.
"""

from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence

from quickdraft.acceptance import AcceptanceEstimate, outcomes
from quickdraft.costs import DraftCost, TargetCost
from quickdraft.drafters.base import Draft, Drafter, is_lookup
from quickdraft.verify import Verdict

EXPLORATION_BUDGET = 0.02  # expected tokens a probe may lose, per token produced
RATE_DECAY = 0.95  # weight kept by older steps in the measured speed (about 20 steps)


@dataclass(frozen=True)
class DraftOption:
    """One drafter the step could use, as the decision rule sees it."""

    name: str
    acceptance: tuple[float, ...]  # [most tokens it may draft now]: P(token i accepted | tokens before it accepted)
    seconds_per_token: float  # drafting cost per token; 0 when the proposal is already made (a lookup)


@dataclass(frozen=True)
class Choice:
    """What one step does."""

    drafter: str | None  # None: plain decoding
    k: int  # tokens to draft; 0 exactly when drafter is None
    value: float  # expected tokens - reference_rate * expected seconds


def expected_tokens(acceptance: Sequence[float], k: int) -> float:
    """E: tokens a step yields when drafting the first k of a proposal (the target's token included)."""
    total, all_accepted = 1.0, 1.0
    for rate in acceptance[:k]:
        all_accepted *= rate
        total += all_accepted
    return total


def step_value(option: DraftOption, k: int, target_seconds: Sequence[float], reference_rate: float) -> float:
    """E - rho * T of drafting k tokens with `option`; target_seconds[n - 1] is t(n)."""
    seconds = k * option.seconds_per_token + target_seconds[k]
    return expected_tokens(option.acceptance, k) - reference_rate * seconds


def choose(options: Sequence[DraftOption], target_seconds: Sequence[float], reference_rate: float) -> Choice:
    """The (drafter, k) with the largest E - rho * T; k = 0 (plain decoding) on ties.

    target_seconds: [k_limit + 1] t(1), t(2), ...: k is at most len(target_seconds) - 1.
    """
    best = Choice(None, 0, 1.0 - reference_rate * target_seconds[0])
    for option in options:
        for k in range(1, min(len(option.acceptance), len(target_seconds) - 1) + 1):
            value = step_value(option, k, target_seconds, reference_rate)
            if value > best.value:
                best = Choice(option.name, k, value)
    return best


def best_rate(options: Sequence[DraftOption], target_seconds: Sequence[float]) -> float:
    """The largest E / T on offer (plain decoding included): tokens per second of the best single choice."""
    rates = [1.0 / target_seconds[0]]
    for option in options:
        for k in range(1, min(len(option.acceptance), len(target_seconds) - 1) + 1):
            rates.append(expected_tokens(option.acceptance, k) / (k * option.seconds_per_token + target_seconds[k]))
    return max(rates)


@dataclass(frozen=True)
class Plan:
    """A step's decision, with what was done to reach it."""

    drafter: str | None  # the drafter to draft with; None: plain decoding
    k: int  # tokens to draft (a lookup's proposal is cut to k)
    lookups: Mapping[str, Draft] = field(default_factory=dict)  # proposals made before deciding, by drafter name


class Controller(Protocol):
    """Plans each step of one request and learns from its outcome."""

    def plan(self, context: list[int], limit: int) -> Plan:
        """The step's drafter and k (k <= limit), given the committed context."""

    def observe(self, plan: Plan, draft: Draft, verdict: Verdict, draft_seconds: float, target_seconds: float) -> None:
        """What the step drafted, what the target produced, and how long each part took."""

    def finish(self) -> None:
        """The request has ended."""


class FixedController:
    """A fixed k with one drafter: every step drafts up to k tokens."""

    def __init__(self, drafter: str, k: int) -> None:
        self.drafter = drafter
        self.k = k

    def plan(self, context: list[int], limit: int) -> Plan:
        return Plan(self.drafter, min(self.k, limit))

    def observe(self, plan: Plan, draft: Draft, verdict: Verdict, draft_seconds: float, target_seconds: float) -> None:
        pass

    def finish(self) -> None:
        pass


@dataclass
class ControllerMemory:
    """What an engine has measured, shared by its requests: costs, and acceptance carried to the next request."""

    target: TargetCost
    draft_costs: dict[str, DraftCost] = field(default_factory=dict)  # model drafters, by name
    acceptance: dict[str, tuple[float, ...]] = field(default_factory=dict)  # last request's estimates, by drafter name


class RateMeter:
    """Tokens per second over recent steps (exponentially decayed sums)."""

    def __init__(self) -> None:
        self._tokens = 0.0
        self._seconds = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self._tokens = RATE_DECAY * self._tokens + tokens
        self._seconds = RATE_DECAY * self._seconds + seconds

    def rate(self) -> float | None:
        return self._tokens / self._seconds if self._seconds > 0 else None


class AdaptiveController:
    """Chooses the drafter and k of every step of one request (see the module docstring)."""

    def __init__(self, drafters: Mapping[str, Drafter], memory: ControllerMemory, k_max: int) -> None:
        self._drafters = dict(drafters)
        self._memory = memory
        self._k_max = k_max
        self._estimates = {name: AcceptanceEstimate(k_max, memory.acceptance.get(name, ())) for name in drafters}
        self._credit = {name: 0.0 for name, drafter in drafters.items() if not is_lookup(drafter)}  # model drafters
        self._fed = dict.fromkeys(self._credit, 0)  # context length each model drafter has caught up to
        self._context_length = 0  # of the step being planned
        self._speed = RateMeter()

    def plan(self, context: list[int], limit: int) -> Plan:
        limit = min(limit, self._k_max)
        if limit < 1:
            return Plan(None, 0)
        self._context_length = len(context)
        lookups = {name: d.propose(context, limit) for name, d in self._drafters.items() if is_lookup(d)}
        target_seconds = [self._memory.target.seconds(n) for n in range(1, limit + 2)]  # [limit + 1]
        usable = [name for name in self._drafters if name not in lookups or len(lookups[name])]  # lookups that matched
        options = [self._option(name, lookups, limit) for name in usable]
        reference_rate = max(self._speed.rate() or best_rate(options, target_seconds), 1.0 / target_seconds[0])
        choice = self._explore(choose(options, target_seconds, reference_rate), options, target_seconds, reference_rate)
        return Plan(choice.drafter, choice.k, lookups)

    def observe(self, plan: Plan, draft: Draft, verdict: Verdict, draft_seconds: float, target_seconds: float) -> None:
        produced = verdict.tokens
        self._speed.add(len(produced), self._priced_seconds(plan.drafter, len(draft)))
        for name, proposal in plan.lookups.items():
            self._estimates[name].observe(outcomes(proposal.token_ids, produced))
        if plan.drafter in self._credit and len(draft):
            self._estimates[plan.drafter].observe(outcomes(draft.token_ids, produced))
            self._memory.draft_costs[plan.drafter].observe(len(draft), self._behind(plan.drafter), draft_seconds)
            self._fed[plan.drafter] = self._context_length + len(produced) - 1  # its cache holds the accepted draft
        for name in self._credit:
            self._credit[name] = 0.0 if name == plan.drafter else self._credit[name] + EXPLORATION_BUDGET * len(produced)
        self._memory.target.observe(len(draft) + 1, target_seconds)

    def finish(self) -> None:
        self._memory.acceptance.update({name: tuple(estimate.means()) for name, estimate in self._estimates.items()})

    def _behind(self, drafter: str) -> int:
        """Tokens of context the model drafter has to catch up on before proposing."""
        return self._context_length - self._fed[drafter]

    def _priced_seconds(self, drafter: str | None, k: int) -> float:
        """What the cost model says a step drafting k tokens with `drafter` takes (a lookup's time is not counted)."""
        draft_cost = self._memory.draft_costs.get(drafter) if drafter else None
        return (k * draft_cost.seconds_per_token if draft_cost else 0.0) + self._memory.target.seconds(k + 1)

    def _option(self, name: str, lookups: Mapping[str, Draft], limit: int) -> DraftOption:
        proposal = lookups.get(name)
        length = limit if proposal is None else len(proposal)
        seconds = 0.0 if proposal is not None else self._memory.draft_costs[name].seconds_per_token
        return DraftOption(name, tuple(self._estimates[name].means()[:length]), seconds)

    def _explore(self, choice: Choice, options: list[DraftOption], target_seconds: list[float], reference_rate: float) -> Choice:
        """A 1-token probe of a model drafter instead, when its credit covers the probe's expected loss."""
        for option in options:
            if option.name in self._credit and option.name != choice.drafter:
                catch_up = self._behind(option.name) * self._memory.draft_costs[option.name].seconds_per_catch_up_token
                probe_value = step_value(option, 1, target_seconds, reference_rate) - reference_rate * catch_up
                loss = choice.value - probe_value
                if self._credit[option.name] >= loss:
                    self._credit[option.name] -= loss
                    return Choice(option.name, 1, probe_value)
        return choice
