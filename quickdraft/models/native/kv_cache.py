"""A preallocated key/value cache written by position; rollback only moves the length.

Every layer keeps keys and values for all positions 0..capacity-1, sliding-window layers
included: attention on those layers reads only the last `window` positions, so rolling back
never needs entries that were overwritten (a ring buffer would lose them). Capacity starts
small and doubles when a forward would overflow it, up to the model's context limit; between
growths no tensor is allocated and a forward writes its new keys in place.
"""

import torch

from quickdraft.errors import InternalError, UsageError

INITIAL_CAPACITY = 1024  # positions allocated up front; grows by doubling, at most max_context


class KVCache:
    """Keys and values of one sequence for every layer: [layers, KV, capacity, hd] each."""

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        max_context: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.max_context = max_context
        self.length = 0  # positions 0..length-1 hold valid keys and values
        self._shape = (num_layers, num_kv_heads, 0, head_dim)
        self._dtype, self._device = dtype, device
        self.keys: list[torch.Tensor] = []  # per layer [KV, capacity, hd], views into one buffer
        self.values: list[torch.Tensor] = []
        self._allocate(min(INITIAL_CAPACITY, max_context))

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[1]

    def reserve(self, new_tokens: int) -> bool:
        """Make room for `new_tokens` more positions; True when the buffers were reallocated."""
        needed = self.length + new_tokens
        if needed > self.max_context:
            raise UsageError(f"sequence of {needed} tokens exceeds the model's context of {self.max_context}")
        if needed <= self.capacity:
            return False
        self._allocate(min(self.max_context, max(2 * self.capacity, needed)))
        return True

    def write(self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Store keys, values [n, KV, hd] of positions start..start+n-1."""
        n = keys.shape[0]
        self.keys[layer][:, start : start + n].copy_(keys.transpose(0, 1))
        self.values[layer][:, start : start + n].copy_(values.transpose(0, 1))

    def read(self, layer: int, begin: int, end: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys, values of positions begin..end-1: views [KV, end-begin, hd]."""
        return self.keys[layer][:, begin:end], self.values[layer][:, begin:end]

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise InternalError(f"cannot roll back to {length}: the cache holds {self.length} tokens")
        self.length = length

    def _allocate(self, capacity: int) -> None:
        layers, kv_heads, _, head_dim = self._shape
        shape = (layers, kv_heads, capacity, head_dim)
        new_keys = torch.zeros(shape, dtype=self._dtype, device=self._device)
        new_values = torch.zeros(shape, dtype=self._dtype, device=self._device)
        for layer, (old_k, old_v) in enumerate(zip(self.keys, self.values)):
            new_keys[layer, :, : self.length].copy_(old_k[:, : self.length])
            new_values[layer, :, : self.length].copy_(old_v[:, : self.length])
        self.keys, self.values = list(new_keys.unbind(0)), list(new_values.unbind(0))
