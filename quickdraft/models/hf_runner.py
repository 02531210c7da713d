"""The transformers fallback runner: any `AutoModelForCausalLM`, with a `DynamicCache`.

Rollback crops the cache (`DynamicCache.crop`), which slices tensors: correct for every
architecture transformers supports, but not O(1). The native runners are the fast path. The
cache is built without the model config, so every layer keeps its full history (sliding-window
layers included) and the model's own attention masks apply the window; this is what lets a
sliding-window layer be cropped back after its window has filled.
"""

from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel

from quickdraft.errors import InternalError
from quickdraft.models.base import ModelInfo


class HFRunner:
    """`ModelRunner` over a transformers causal LM, batch 1."""

    def __init__(self, model: PreTrainedModel, info: ModelInfo) -> None:
        self.model = model.eval()
        self.info = info
        self.device = model.device
        self.dtype = model.dtype
        self._cache = DynamicCache()

    @property
    def cache_length(self) -> int:
        return self._cache.get_seq_length()

    @torch.inference_mode()
    def prefill(self, token_ids: Sequence[int], *, hidden_layers: Sequence[int] = ()):
        self._cache = DynamicCache()
        logits, hidden = self._run(token_ids, logits_to_keep=1, hidden_layers=tuple(hidden_layers))
        return (logits[-1], hidden) if hidden_layers else logits[-1]

    @torch.inference_mode()
    def forward(self, token_ids: Sequence[int], *, hidden_layers: Sequence[int] = ()):
        logits, hidden = self._run(token_ids, logits_to_keep=0, hidden_layers=tuple(hidden_layers))
        return (logits, hidden) if hidden_layers else logits

    def embedding_matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(token embeddings [vocab, hidden], output layer [vocab, hidden]) as stored (no embedding scale)."""
        return self.model.get_input_embeddings().weight.detach(), self.model.get_output_embeddings().weight.detach()

    def linear_layers(self) -> list:
        """Empty: transformers' modules do not expose their matrix products as one list."""
        return []

    def rollback(self, length: int) -> None:
        surplus = self.cache_length - length
        if surplus < 0:
            raise InternalError(f"cannot roll back to {length}: only {self.cache_length} tokens are cached")
        if surplus:
            self._cache.crop(-surplus)

    def _run(self, token_ids: Sequence[int], logits_to_keep: int, hidden_layers: tuple[int, ...]):
        start = self.cache_length
        input_ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)  # [1, n]
        positions = torch.arange(start, start + input_ids.shape[1], device=self.device)  # [n]
        out = self.model(
            input_ids=input_ids,
            cache=self._cache,
            use_cache=True,
            position_ids=positions[None],
            logits_to_keep=logits_to_keep,
            output_hidden_states=bool(hidden_layers),
        )
        logits = out.logits[0].float()  # [n or 1, vocab]
        if not hidden_layers:
            return logits, None
        states = out.hidden_states  # num_layers + 1 of [1, n, hidden]: what each layer reads, then the final norm's
        return logits, torch.cat([states[layer][0] for layer in hidden_layers], dim=-1).float()  # [n, layers * hidden]
