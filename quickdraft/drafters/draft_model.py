"""A smaller causal LM with the target's tokenizer, drafting autoregressively with its own KV cache.

The drafter remembers which token ids its cache holds. Each `propose` rolls the cache back to
the longest prefix it shares with the committed context, feeds the rest, then drafts k tokens
one forward at a time, sampling with the request's parameters (argmax when greedy). Its logits
are cut or padded to the target's vocabulary before warping, so the distribution a token is
drawn from is exactly the `probs` row handed to the verifier.
"""

import copy

import torch
from transformers import PreTrainedTokenizerBase

from quickdraft import sampling
from quickdraft.categorical import draw
from quickdraft.config import SamplingParams
from quickdraft.drafters.base import Draft, Drafter, DrafterLoadOptions
from quickdraft.errors import UsageError
from quickdraft.models.base import BatchRunner, ModelRunner
from quickdraft.models.loading import LoadedModel, load_model
from quickdraft.models.slot_view import SlotView

MAX_TOKENIZER_SIZE_DIFFERENCE = 128  # tokenizers may differ by a few added/padding tokens at the end


class DraftModelDrafter(Drafter):
    def __init__(self, runner: ModelRunner, target_vocab_size: int, name: str) -> None:
        self.runner = runner
        self.target_vocab_size = target_vocab_size
        self.name = name
        self._cached_ids: list[int] = []
        self._params = SamplingParams()
        self._generator: torch.Generator | None = None

    @classmethod
    def from_argument(cls, argument: str, target: LoadedModel, options: DrafterLoadOptions) -> "DraftModelDrafter":
        """A draft model by name or path, loaded with `options`; refused if its tokenizer differs from the target's."""
        draft = load_model(argument, runtime=options.runtime, dtype=options.dtype, device=options.device)
        check_vocab_compatible(target.tokenizer, draft.tokenizer, argument)
        return cls(draft.runner, target.info.vocab_size, name=argument)

    def begin(self, prompt_ids: list[int], params: SamplingParams, generator: torch.Generator) -> None:
        self._params = params
        self._generator = generator

    def fork(self) -> "DraftModelDrafter":
        """A drafter over a KV cache slot of its own in the same draft model (released by `finish`)."""
        fork = copy.copy(self)
        if isinstance(self.runner, BatchRunner):
            fork.runner, fork._cached_ids = SlotView(self.runner), []
        return fork  # else one cache: forks share it and its record (see `_catch_up`)

    def finish(self) -> None:
        if isinstance(self.runner, SlotView):
            self.runner.close()

    def propose(self, context_ids: list[int], k: int) -> Draft:
        if k == 0:
            return Draft(token_ids=())
        logits = self._catch_up(context_ids)  # [vocab]
        tokens: list[int] = []
        rows: list[torch.Tensor] = []
        for step in range(k):
            probs = sampling.warp(self._fit_vocab(logits)[None], self._params)[0]  # [target_vocab]
            token = int(probs.argmax()) if self._params.greedy else int(draw(probs[None], self._generator))
            tokens.append(token)
            rows.append(probs)
            if step < k - 1:
                logits = self._feed([token])
        return Draft(token_ids=tuple(tokens), probs=torch.stack(rows))  # probs: [k, target_vocab]

    def _catch_up(self, context_ids: list[int]) -> torch.Tensor:
        """Roll back to the shared prefix, feed the rest of the context; logits of its last token.

        `_cached_ids` is only changed in place, so forks sharing one cache also share the record of what it
        holds: a proposal for one request after another's re-syncs the cache to its own context."""
        shared = _shared_prefix_length(self._cached_ids, context_ids)
        shared = min(shared, len(context_ids) - 1)  # always feed at least one token to get logits
        if shared == 0:
            return self._prefill(context_ids)
        self.runner.rollback(shared)
        del self._cached_ids[shared:]
        return self._feed(context_ids[shared:])

    def _prefill(self, token_ids: list[int]) -> torch.Tensor:
        self._cached_ids[:] = token_ids
        return self.runner.prefill(token_ids)

    def _feed(self, token_ids: list[int]) -> torch.Tensor:
        self._cached_ids.extend(token_ids)
        return self.runner.forward(token_ids)[-1]

    def _fit_vocab(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits [draft_vocab] -> [target_vocab]: cut surplus rows, pad missing ones with -inf."""
        missing = self.target_vocab_size - logits.shape[-1]
        if missing <= 0:
            return logits[: self.target_vocab_size]
        return torch.nn.functional.pad(logits, (0, missing), value=float("-inf"))


def _shared_prefix_length(a: list[int], b: list[int]) -> int:
    limit = min(len(a), len(b))
    for i in range(limit):
        if a[i] != b[i]:
            return i
    return limit


def check_vocab_compatible(target: PreTrainedTokenizerBase, draft: PreTrainedTokenizerBase, draft_name: str) -> None:
    """Refuse a draft whose tokenizer maps ids to different token strings than the target's."""
    target_vocab = {i: t for t, i in target.get_vocab().items()}
    draft_vocab = {i: t for t, i in draft.get_vocab().items()}
    if abs(len(target_vocab) - len(draft_vocab)) > MAX_TOKENIZER_SIZE_DIFFERENCE:
        raise UsageError(
            f"draft model {draft_name} has a {len(draft_vocab)}-token vocabulary but the target has "
            f"{len(target_vocab)}; use a draft with the target's tokenizer, or --drafter ngram"
        )
    shared = set(target_vocab) & set(draft_vocab)
    differing = [i for i in sorted(shared) if target_vocab[i] != draft_vocab[i]]
    if differing:
        i = differing[0]
        raise UsageError(
            f"draft model {draft_name} has a different tokenizer ({len(differing)} ids differ, e.g. id {i}: "
            f"{draft_vocab[i]!r} vs {target_vocab[i]!r}); use a draft with the target's tokenizer, or --drafter ngram"
        )
