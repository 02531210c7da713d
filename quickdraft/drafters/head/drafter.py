"""`head:DIR`: drafting with an EAGLE-3 head that reads the target's own hidden states.

The engine hands this drafter the target's states a_t of every committed position from the three
layers the head fuses (`observe_target`, after the prefill and after each verification). With x the
committed tokens, the head's cache holds the pairs (fc(a_t), x_{t+1}) computed from true states;
`propose` first feeds the pairs it has not seen, whose last output drafts the token after the
pending one, then drafts k tokens on its own outputs. Draft entries in the head's cache are rolled
back before the next step re-feeds true states.

The head drafts in its inference form (`inference.py`: 4-bit group matrices, the layer in C++) on CPU.

Draft tokens come from a reduced vocabulary. For sampling, the draft logits are warped like the
target's (temperature, top-k, top-p pick the same tokens whether or not the target's other ids sit
beside them at -inf), the token is drawn over the reduced vocabulary, and that distribution is
scattered into the target's: each proposal row is zero outside the reduced vocabulary and exactly
the distribution the token was drawn from. Warping and drawing over the draft vocabulary rather than
the target's saves most of a sampled drafting step on gemma-3's 262,144 ids.
"""

from pathlib import Path

import torch

from quickdraft import sampling
from quickdraft.categorical import draw
from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Draft, Drafter, DrafterLoadOptions
from quickdraft.drafters.head.files import load_head
from quickdraft.drafters.head.inference import InferenceHead, inference_form
from quickdraft.drafters.head.model import DraftHead, HeadCache
from quickdraft.errors import InternalError, UsageError
from quickdraft.models.loading import LoadedModel
from quickdraft.models.native.kernels import argmax

SHIPPED_HEADS = Path(__file__).resolve().parents[2] / "heads"  # quickdraft/heads/<target name>/


class HeadDrafter(Drafter):
    def __init__(self, head: DraftHead | InferenceHead, target_vocab_size: int, name: str) -> None:
        self.head = head
        self.target_layers = tuple(head.config.aux_layers)  # the engine passes these states to observe_target
        self.vocab_ids = head.vocab_ids  # [draft_vocab] target id of each draft logit
        self.target_vocab_size = target_vocab_size
        self.name = name
        self._params = SamplingParams()
        self._generator: torch.Generator | None = None
        self._states: list[torch.Tensor] = []  # chunks of [n, 3 * d]: the target's states the head has not read yet
        self._known = 0  # committed positions whose state has been observed
        self._cache = HeadCache()  # the head's keys and values; the first _true_pairs come from true states
        self._true_pairs = 0
        self._after_pending = torch.zeros(0)  # [d] the head's output at the last true pair

    @classmethod
    def from_argument(cls, argument: str, target: LoadedModel, options: DrafterLoadOptions) -> "HeadDrafter":
        """`head` (the head shipped for the target), `head:NAME` (a shipped head) or `head:DIR`."""
        directory = head_directory(argument, target.info.name)
        head = inference_form(load_head(directory, target).to(target.runner.device))
        return cls(head, target.info.vocab_size, name=f"head:{directory}")

    def begin(self, prompt_ids: list[int], params: SamplingParams, generator: torch.Generator) -> None:
        self._params = params
        self._generator = generator
        self._states, self._known = [], 0
        self._cache = HeadCache()
        self._true_pairs = 0

    def observe_target(self, hidden: torch.Tensor) -> None:
        """The target's states [n, 3 * d] at the next n committed positions."""
        self._states.append(hidden.detach())
        self._known += hidden.shape[0]

    @torch.inference_mode()
    def propose(self, context_ids: list[int], k: int) -> Draft:
        if k == 0:
            return Draft(token_ids=())
        if self._known != len(context_ids) - 1:
            raise InternalError(
                f"head drafter has {self._known} target states for a context of {len(context_ids)} tokens; "
                "the engine must call observe_target"
            )
        out = self._catch_up(context_ids)  # [d]
        tokens, rows = [], []
        for step in range(k):
            token, row = self._choose(self.head.draft_logits(out))
            tokens.append(token)
            rows.append(row)
            if step < k - 1:
                out = self.head.step(out[None], torch.tensor([token], device=out.device), self._cache)[-1]
        probs = None if self._params.greedy else torch.stack(rows)  # [k, target_vocab]
        return Draft(token_ids=tuple(tokens), probs=probs)

    def _catch_up(self, context_ids: list[int]) -> torch.Tensor:
        """Drop draft pairs, feed the true pairs not yet seen; the prediction after the pending token [d]."""
        self._cache.length = self._true_pairs
        if self._true_pairs == self._known:  # nothing committed since the last draft
            return self._after_pending
        unseen = torch.cat(self._states) if len(self._states) > 1 else self._states[0]  # [known - true pairs, 3 * d]
        self._states = []  # read once: the head's cache holds what it needs of them
        new_tokens = torch.tensor(context_ids[self._true_pairs + 1 :], device=unseen.device)  # x_{t+1} of each
        stream = self.head.fuse(unseen)  # [known - true pairs, d]
        self._after_pending = self.head.step(stream, new_tokens, self._cache)[-1]
        self._true_pairs = self._known
        return self._after_pending

    def _choose(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """Reduced-vocab logits [draft_vocab] -> (target token id, its draft distribution [target_vocab] or None)."""
        if self._params.greedy:
            return int(self.vocab_ids[argmax(logits)]), None
        reduced = sampling.warp(logits[None], self._params)  # [1, draft_vocab]
        drawn = int(draw(reduced, self._generator))
        probs = reduced.new_zeros(self.target_vocab_size)  # [target_vocab], zero outside the reduced vocabulary
        probs[self.vocab_ids] = reduced[0]
        return int(self.vocab_ids[drawn]), probs


def head_directory(argument: str, target_name: str) -> Path:
    """`head:DIR`, `head:NAME` (a head shipped in quickdraft/heads) or bare `head` (the one shipped for the target)."""
    name = argument or Path(target_name).name
    for candidate in (Path(argument).expanduser() if argument else None, SHIPPED_HEADS / name):
        if candidate is not None and candidate.is_dir():
            return candidate
    shipped = ", ".join(sorted(p.name for p in SHIPPED_HEADS.glob("*") if p.is_dir())) or "none"
    raise UsageError(
        f"no draft head at {name!r} (shipped heads: {shipped}); pass head:DIR with a directory from quickdraft distill"
    )
