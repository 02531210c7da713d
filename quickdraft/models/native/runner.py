"""`NativeRunner`: quickdraft's own decoder forward over preallocated KV cache slots.

Fused projections, no module hooks and no per-step allocation beyond the activations; on the CPU every forward runs
its layers in one call of the C++ decoder (`kernels/decoder.cpp`), on other devices one Python loop over layers
(`_layer`), the same operators in the same order. See `spec.py` for what distinguishes the supported families.

The runner holds several sequences, one `KVCache` slot each (`BatchRunner`). A batched forward
stacks every sequence's new tokens into one [N, d] activation: embeddings, norms and RoPE run over
all N rows at once, the matrix products over all verification rows at once where the form is
row-invariant (int8, a GGUF's blocks, dense tiles on a GPU) and over each prompt block on its own (4-bit
blocks: in the one product of all rows; see `Linear.batched` for why each row equals its sequence's own),
while attention runs per sequence over its own cache with exactly the shapes a forward of that sequence
alone would use: on the CPU every row alone (`kernels.attend`), prompt rows included; on other devices a
prompt block in one masked product (`layers.attention`). The batch-1 `ModelRunner` methods work on slot 0.
"""

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from quickdraft.errors import InternalError
from quickdraft.models.base import PREFILL_BLOCK, ModelInfo, SequenceOutput, SequenceStep
from quickdraft.models.native.kernels import attend as attend_rows
from quickdraft.models.native.kernels import new_decoder, rms_norm
from quickdraft.models.native.kernels import rope as rope_rows
from quickdraft.models.native.kv_cache import KVCache
from quickdraft.models.native.layers import (
    attention,
    block_mask,
    gated_mlp,
    key_begin,
)
from quickdraft.models.native.rope import RopeTable
from quickdraft.models.native.spec import DecoderSpec
from quickdraft.models.native.weights import LayerWeights, Linear, ModelWeights, RowGroup

PREFILL_CHUNK = 4 * PREFILL_BLOCK  # prompt tokens per forward during a batch-1 prefill
OWN_SLOT = 0  # the slot of the batch-1 methods (prefill, forward, rollback)
MATRIX_FORMS = {"dense": 0, "int8": 1, "int4": 2, "int8/32": 3}  # Linear.form -> decoder.cpp's Form


@dataclass(frozen=True)
class _Part:
    """Rows of one sequence that go through the matrix products together (a prompt block, or a verification), and
    off the CPU a prompt block's rows attend in one product."""

    start: int  # position of its first row
    rows: slice  # within the sequence's new rows
    masks: dict[int | None, torch.Tensor] | None  # a prompt block's `block_mask` by sliding window size (None:
    # full attention) where it attends in one product; None where its rows attend alone (a verification, and on
    # the CPU every row)


@dataclass(frozen=True)
class _Sequence:
    """One sequence of a batched forward, as the layers see it."""

    cache: KVCache
    start: int  # its first new position
    rows: slice  # its rows in the stacked activations
    parts: tuple[_Part, ...]  # a verification: one part; a prompt chunk: one per PREFILL_BLOCK it touches
    prompt: bool  # a prompt chunk (its parts are prompt blocks)

    def row_groups(self) -> tuple[RowGroup, ...]:
        """How its rows go through the matrix products: a verification together, a prompt chunk by block."""
        if not self.prompt:
            return (RowGroup(self.rows, prompt_block=False),)
        offset = self.rows.start
        return tuple(RowGroup(slice(offset + p.rows.start, offset + p.rows.stop), True) for p in self.parts)


@dataclass(frozen=True)
class _AloneRows:
    """The rows of a batched forward that attend alone (on the CPU every row; elsewhere every row outside a prompt
    chunk), as `kernels.attend` reads them."""

    caches: tuple[KVCache, ...]  # of their sequences, in order
    sequence: torch.Tensor  # [R] int64: each row's index into caches
    spans: dict[int | None, tuple[torch.Tensor, torch.Tensor]]  # window size -> first, last + 1 position [R] each
    rows: torch.Tensor | None  # [R] their rows in the stacked activations (on the runner's device); None when every
    # row attends alone


class NativeRunner:
    """A `BatchRunner` for one Llama-family or Gemma 3 model."""

    def __init__(
        self, info: ModelInfo, spec: DecoderSpec, weights: ModelWeights, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.info = info
        self.device = device
        self.spec = spec
        self.dtype = dtype  # activations and KV cache
        # on the CPU prompt rows attend alone too, as verification rows do (`kernels.attend`): 1.2-1.3x faster than a
        # prompt block's masked product there (docs/native_runtime.md, stop 46), and a row's attention depends on
        # its position only; elsewhere a prompt block attends in one masked product (`layers.attention`)
        self.prompt_rows_attend_alone = device.type == "cpu"
        self._weights = weights
        self._slots: dict[int, KVCache] = {OWN_SLOT: self._new_cache()}
        self._free: list[int] = []  # opened slots closed since, whose caches are reused
        self._rope = self._rope_tables(self._slots[OWN_SLOT].capacity)
        self._qk_width = (spec.num_heads + spec.num_kv_heads) * spec.head_dim
        self._embedding_scale = (
            None if spec.embedding_scale is None else torch.tensor(spec.embedding_scale, dtype=dtype, device=device)
        )
        self._windows = tuple(dict.fromkeys(spec.layer_windows))  # each sliding-window size once (None: full)
        # the C++ decoder, which runs every forward (same bits as the Python layers); None: every forward through the
        # Python layers (other devices; tests and scripts/decode_profile.py set it so)
        self.decoder = self._native_decoder() if device.type == "cpu" else None

    @property
    def cache_length(self) -> int:
        return self._slots[OWN_SLOT].length

    def prefill(self, token_ids: Sequence[int], hidden_layers: Sequence[int] = ()):
        """Reset the cache, run the prompt in chunks; logits [vocab] of its last position (and hidden
        [n, len(hidden_layers) * d])."""
        if not token_ids:
            raise InternalError("prefill needs at least one token")
        self.rollback(0)
        layers, hidden_chunks = tuple(hidden_layers), []
        for begin in range(0, len(token_ids), PREFILL_CHUNK):
            chunk = tuple(token_ids[begin : begin + PREFILL_CHUNK])
            last = begin + PREFILL_CHUNK >= len(token_ids)
            (out,) = self.forward_batch([SequenceStep(OWN_SLOT, chunk, "last" if last else "none", layers)])
            hidden_chunks.append(out.hidden)
        return (out.logits[0], torch.cat(hidden_chunks)) if layers else out.logits[0]

    def forward(self, token_ids: Sequence[int], hidden_layers: Sequence[int] = ()):
        """Append tokens at positions cache_length..; logits [n, vocab] float32 (and hidden [n, len(layers) * d])."""
        if not token_ids:
            raise InternalError("forward needs at least one token")
        layers = tuple(hidden_layers)
        (out,) = self.forward_batch([SequenceStep(OWN_SLOT, tuple(token_ids), "all", layers)])
        return (out.logits, out.hidden) if layers else out.logits

    def rollback(self, length: int) -> None:
        self._slots[OWN_SLOT].rollback(length)

    def open_slot(self) -> int:
        slot = self._free.pop() if self._free else len(self._slots)
        if slot not in self._slots:  # a closed slot keeps its cache: reopening it allocates nothing
            self._slots[slot] = self._new_cache()
        self._slots[slot].rollback(0)
        return slot

    def close_slot(self, slot: int) -> None:
        if slot == OWN_SLOT or slot not in self._slots or slot in self._free:
            raise InternalError(f"slot {slot} is not open")
        self._free.append(slot)

    def slot_length(self, slot: int) -> int:
        return self._slots[slot].length

    def rollback_slot(self, slot: int, length: int) -> None:
        self._slots[slot].rollback(length)

    def slot_bytes(self) -> int:
        spec = self.spec
        per_position = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * self.dtype.itemsize
        return per_position * spec.max_context

    def embedding_matrices(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(token embeddings [vocab, d], output layer [vocab, d]) as stored (embedding scale not applied)."""
        return self._weights.embedding, self._weights.lm_head.dense()

    def linear_layers(self) -> list[Linear]:
        """Every matrix product a forward runs, in order (the benchmark times them alone: a decode ceiling)."""
        per_layer = [
            linear for layer in self._weights.layers for linear in (layer.qkv, layer.o, layer.gate_up, layer.down)
        ]
        return [*per_layer, self._weights.lm_head]

    @torch.inference_mode()
    def forward_batch(self, steps: Sequence[SequenceStep]) -> list[SequenceOutput]:
        """One forward over every step's new tokens; each sequence's rows as its own forward would give them."""
        if not steps or not all(step.token_ids for step in steps):
            raise InternalError("a batched forward needs at least one token for every sequence")
        if len({step.slot for step in steps}) != len(steps):
            raise InternalError("a batched forward got the same slot twice")
        sequences = self._sequences(steps)
        lengths = [len(step.token_ids) for step in steps]
        positions = torch.cat([torch.arange(s.start, s.start + n) for s, n in zip(sequences, lengths)])  # [N]
        positions = positions.to(self.device)
        rope = {key: (table.cos[positions], table.sin_signed[positions]) for key, table in self._rope.items()}
        groups = tuple(group for sequence in sequences for group in sequence.row_groups())
        wanted = self._check_layers(steps)
        alone = self._alone_rows(sequences)
        x = self._embed([token for step in steps for token in step.token_ids])  # [N, d]
        entering: dict[int, torch.Tensor] = {}  # layer id -> the residual stream entering it [N, d]
        if self.decoder is not None:
            x, entering = self._decode(x, sequences, groups, rope, alone, wanted)
        else:
            for i, layer in enumerate(self._weights.layers):
                if i in wanted:
                    entering[i] = x
                x = self._layer(i, layer, x, sequences, groups, rope[self.spec.layer_rope[i]], alone)
        for sequence, n in zip(sequences, lengths):
            sequence.cache.length = sequence.start + n
        return self._outputs(steps, sequences, x, entering)

    def _decode(
        self,
        x: torch.Tensor,
        sequences: list[_Sequence],
        groups: tuple[RowGroup, ...],
        rope: dict[str, tuple[torch.Tensor, torch.Tensor]],
        alone: "_AloneRows",
        wanted: set[int],
    ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Every layer of a forward in one call of the C++ decoder (`kernels/decoder.cpp`): the same kernels and
        operators in the same order as `_layer` on the CPU (every row attending alone), so the same bits. x [N, d]
        -> (x after the last layer [N, d], the residual stream entering each wanted layer)."""
        if alone.rows is not None:
            raise InternalError("the C++ decoder attends every row alone; prompt_rows_attend_alone must stay set")
        layers = sorted(wanted & set(range(self.spec.num_layers)))
        _, end = next(iter(alone.spans.values()))  # the same in every window
        out = self.decoder.run(
            x,
            [keys for seq in sequences for keys in seq.cache.keys],
            [values for seq in sequences for values in seq.cache.values],
            [seq.start for seq in sequences],
            [_length(seq.rows) for seq in sequences],
            [v for group in groups for v in (group.rows.start, _length(group.rows), int(group.prompt_block))],
            [cos for cos, _ in rope.values()],
            [sin for _, sin in rope.values()],
            alone.sequence,
            end,
            [alone.spans[window][0] for window in self._windows],
            layers,
        )
        return out[0], dict(zip(layers, out[1:]))

    def _native_decoder(self):
        """The C++ decoder (`kernels.new_decoder`) holding every layer's weights; its window and rope slots index
        `self._windows` and `spec.rope`, in their order."""
        spec = self.spec
        native = new_decoder(
            spec.num_heads,
            spec.num_kv_heads,
            spec.head_dim,
            spec.rms_norm_eps,
            spec.attention_scale,
            spec.activation == "gelu_tanh",
        )
        rope_keys = list(spec.rope)
        for i, layer in enumerate(self._weights.layers):
            native.add_layer(
                layer.input_norm,
                layer.qk_norm,
                layer.post_attention_norm,
                layer.pre_mlp_norm,
                layer.post_mlp_norm,
                self._windows.index(spec.layer_windows[i]),
                rope_keys.index(spec.layer_rope[i]),
            )
            for linear in (layer.qkv, layer.o, layer.gate_up, layer.down):
                if linear.row_tile is not None:  # dense tiles are a GPU's (`dense_row_tile`); decoder.cpp has none
                    raise InternalError("the C++ decoder multiplies dense matrices untiled; tiles are for GPUs")
                native.add_matrix(
                    MATRIX_FORMS[linear.form],
                    linear.weight,
                    linear.out_features,
                    linear.scales,
                    linear.bias,
                    linear.prompt_weight,
                    linear.prompt_bias,
                )
        return native

    def _alone_rows(self, sequences: list[_Sequence]) -> "_AloneRows":
        """Which rows attend alone (every one not in a prompt chunk, and on the CPU every one) and the keys each
        reads, per sliding-window size."""
        alone = [seq for seq in sequences if self.prompt_rows_attend_alone or not seq.prompt]
        owner = [j for j, seq in enumerate(alone) for _ in range(_length(seq.rows))]
        positions = [seq.start + j for seq in alone for j in range(_length(seq.rows))]
        spans = {
            window: (
                torch.tensor([key_begin(p, window) for p in positions], dtype=torch.long),
                torch.tensor([p + 1 for p in positions], dtype=torch.long),
            )
            for window in set(self.spec.layer_windows)
        }
        rows = None
        if len(alone) < len(sequences):
            numbers = [r for seq in alone for r in range(seq.rows.start, seq.rows.stop)]
            rows = torch.tensor(numbers, dtype=torch.long, device=self.device)
        return _AloneRows(tuple(seq.cache for seq in alone), torch.tensor(owner, dtype=torch.long), spans, rows)

    def _check_layers(self, steps: Sequence[SequenceStep]) -> set[int]:
        """Every layer id some step asks the states of (0..num_layers, see `models/base.py`)."""
        wanted = {layer for step in steps for layer in step.hidden_layers}
        if any(not 0 <= layer <= self.spec.num_layers for layer in wanted):
            raise InternalError(f"hidden layer ids must lie in 0..{self.spec.num_layers}, got {sorted(wanted)}")
        return wanted

    def _sequences(self, steps: Sequence[SequenceStep]) -> list[_Sequence]:
        """Reserve cache room for every step and describe its rows and attention windows."""
        sequences, offset = [], 0
        for step in steps:
            cache, n = self._slots[step.slot], len(step.token_ids)
            if cache.reserve(n) and cache.capacity > self._rope_capacity:
                self._rope = self._rope_tables(cache.capacity)
            verification = step.logits == "all"
            parts = self._parts(cache.length, n, verification)
            sequences.append(_Sequence(cache, cache.length, slice(offset, offset + n), parts, not verification))
            offset += n
        return sequences

    def _parts(self, start: int, n: int, verification: bool) -> tuple[_Part, ...]:
        """How the rows of positions start..start+n-1 attend.

        Each query of a verification (logits returned) attends alone over exactly the keys a 1-token forward at
        its position reads, with that forward's shapes: masked keys a longer product would carry change where
        its reductions split and how they round on some CPUs (seen on AVX2: a 4-token forward's row differed
        from the 1-token forward's by 0.125 in its logits at 806 cached positions). A prompt chunk has one part
        per PREFILL_BLOCK of positions it touches (its matrix products' row groups, `Linear.batched`); on the CPU its
        rows attend alone like a verification's, elsewhere each block in one masked product, so a row's result
        depends only on its block, never on where the chunk began: a prompt cut into forwards at block boundaries
        leaves the same cache however it was cut.
        """
        if verification:
            return (_Part(start, slice(0, n), None),)
        bounds = [start, *range((start // PREFILL_BLOCK + 1) * PREFILL_BLOCK, start + n, PREFILL_BLOCK), start + n]
        return tuple(
            _Part(
                begin,
                slice(begin - start, end - start),
                None if self.prompt_rows_attend_alone else self._block_masks(begin, end - begin),
            )
            for begin, end in zip(bounds, bounds[1:])
        )

    def _outputs(
        self,
        steps: Sequence[SequenceStep],
        sequences: list[_Sequence],
        x: torch.Tensor,
        entering: dict[int, torch.Tensor],
    ) -> list[SequenceOutput]:
        """Final norm over the rows anyone asked for, one output-layer product over the logit rows; each step's
        asked states (`entering`: the residual stream entering each asked layer, all rows)."""
        wanted = [self._rows_out(step, seq.rows) for step, seq in zip(steps, sequences)]  # (states, logit rows)
        state_rows = [rows for rows, _ in wanted]
        if not any(len(rows) for rows in state_rows):  # no logits and no final states asked
            return [
                SequenceOutput(None, self._hidden(step, seq, None, entering)) for step, seq in zip(steps, sequences)
            ]
        normed = rms_norm(x[torch.cat(state_rows)], self._weights.final_norm, self.spec.rms_norm_eps)  # [M, d]
        per_sequence = normed.split([len(rows) for rows in state_rows])
        logit_inputs = [states[-len(rows) :] for states, (_, rows) in zip(per_sequence, wanted) if rows]
        logit_lengths = [len(rows) for _, rows in wanted if rows]
        bounds = [0, *itertools.accumulate(logit_lengths)]
        logit_groups = tuple(RowGroup(slice(a, b), prompt_block=False) for a, b in zip(bounds, bounds[1:]))
        logits = self._logits(torch.cat(logit_inputs), logit_groups).split(logit_lengths) if logit_lengths else ()
        outputs, next_logits = [], iter(logits)
        for step, seq, states, (_, rows) in zip(steps, sequences, per_sequence, wanted):
            logits = next(next_logits) if rows else None
            outputs.append(SequenceOutput(logits, self._hidden(step, seq, states, entering)))
        return outputs

    def _hidden(
        self, step: SequenceStep, seq: _Sequence, final: torch.Tensor | None, entering: dict[int, torch.Tensor]
    ) -> torch.Tensor | None:
        """The step's asked states [n, len(hidden_layers) * d] float32 (`final`: its final-norm rows, all of them
        when it asked for id num_layers), or None."""
        if not step.hidden_layers:
            return None
        parts = [final if layer == self.spec.num_layers else entering[layer][seq.rows] for layer in step.hidden_layers]
        return torch.cat(parts, dim=-1).float()

    def _rows_out(self, step: SequenceStep, rows: slice) -> tuple[torch.Tensor, range]:
        """(the stacked rows whose final states are needed [m], the last of them that also need logits)."""
        n = _length(rows)
        logit_rows = {"all": range(n), "last": range(n - 1, n), "none": range(0)}[step.logits]
        first = 0 if self.spec.num_layers in step.hidden_layers else (logit_rows.start if logit_rows else n)
        return torch.arange(rows.start + first, rows.stop, device=self.device), logit_rows

    def _layer(
        self,
        i: int,
        layer: LayerWeights,
        x: torch.Tensor,
        sequences: list[_Sequence],
        groups: tuple[RowGroup, ...],
        rope: tuple[torch.Tensor, torch.Tensor],
        alone: "_AloneRows",
    ) -> torch.Tensor:
        spec = self.spec
        qk, values = self._attention_inputs(layer, x, groups, rope)
        queries, keys = qk[:, : spec.num_heads], qk[:, spec.num_heads :]  # [N, H, hd], [N, KV, hd]
        for seq in sequences:
            seq.cache.write(i, seq.start, keys[seq.rows], values[seq.rows])
        window = spec.layer_windows[i]
        if alone.rows is None:  # every row attends alone: one call for all rows
            attended = self._attend_alone(i, queries, alone, window)
        else:
            attended = torch.empty(x.shape[0], spec.num_heads * spec.head_dim, dtype=x.dtype, device=x.device)
            if len(alone.rows):
                attended[alone.rows] = self._attend_alone(i, queries[alone.rows], alone, window)
            for seq in sequences:
                if seq.prompt:  # elsewhere than on the CPU: a prompt block attends in one masked product
                    for part in seq.parts:
                        rows = slice(seq.rows.start + part.rows.start, seq.rows.start + part.rows.stop)
                        attended[rows] = self._attend_prompt_block(i, queries[rows], seq.cache, part, window)
        return self._attention_output_and_mlp(layer, x, attended, groups)

    def _attend_alone(self, i: int, queries: torch.Tensor, alone: "_AloneRows", window: int | None) -> torch.Tensor:
        """Every row alone over exactly the keys a 1-token forward at its position reads, in one kernel call for
        all sequences (`kernels.attend`: a row's result never depends on the other rows): queries [R, H, hd] ->
        [R, H * hd]."""
        caches = alone.caches
        begin, end = alone.spans[window]
        keys, values = [c.keys[i] for c in caches], [c.values[i] for c in caches]
        return attend_rows(queries, keys, values, alone.sequence, begin, end, self.spec.attention_scale)

    def _attend_prompt_block(
        self, i: int, queries: torch.Tensor, cache: KVCache, part: _Part, window: int | None
    ) -> torch.Tensor:
        """A prompt block's queries [n, H, hd] at positions part.start.. over the cache, one masked product:
        [n, H * hd]."""
        keys, values = cache.read(i, key_begin(part.start, window), part.start + queries.shape[0])
        return attention(queries, keys, values, self.spec.attention_scale, part.masks[window])

    def _attention_inputs(
        self,
        layer: LayerWeights,
        x: torch.Tensor,
        groups: tuple[RowGroup, ...],
        rope: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x [N, d] -> rotated queries|keys [N, H + KV, hd], values [N, KV, hd]. Tensors only, no cache."""
        spec, n = self.spec, x.shape[0]
        qkv = layer.qkv.batched(rms_norm(x, layer.input_norm, spec.rms_norm_eps), groups)  # [N, (H + 2 KV) hd]
        qk = qkv[:, : self._qk_width].view(n, spec.num_heads + spec.num_kv_heads, spec.head_dim)
        values = qkv[:, self._qk_width :].view(n, spec.num_kv_heads, spec.head_dim)
        if layer.qk_norm is not None:
            qk = rms_norm(qk, None, spec.rms_norm_eps) * layer.qk_norm
        return rope_rows(qk, *rope), values

    def _attention_output_and_mlp(
        self, layer: LayerWeights, x: torch.Tensor, attended: torch.Tensor, groups: tuple[RowGroup, ...]
    ) -> torch.Tensor:
        """x, attended [N, d] -> the next layer's input [N, d]. Tensors only, no cache."""
        spec = self.spec
        out = layer.o.batched(attended, groups)
        if layer.post_attention_norm is not None:
            out = rms_norm(out, layer.post_attention_norm, spec.rms_norm_eps)
        x = x + out
        out = gated_mlp(rms_norm(x, layer.pre_mlp_norm, spec.rms_norm_eps), layer, spec.activation, groups)
        if layer.post_mlp_norm is not None:
            out = rms_norm(out, layer.post_mlp_norm, spec.rms_norm_eps)
        return x + out

    def _embed(self, token_ids: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor(token_ids, dtype=torch.long, device=self.device)  # [n]
        x = torch.nn.functional.embedding(ids, self._weights.embedding)  # [n, d]
        return x if self._embedding_scale is None else x * self._embedding_scale

    def _logits(self, normed: torch.Tensor, groups: tuple[RowGroup, ...]) -> torch.Tensor:
        """Output layer over final-norm states [m, d] (each sequence's logit rows one group) -> [m, vocab] float32."""
        logits = self._weights.lm_head.batched(normed, groups).float()
        cap = self.spec.final_logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _block_masks(self, start: int, n: int) -> dict[int | None, torch.Tensor]:
        return {w: block_mask(start, n, w, self.dtype, self.device) for w in set(self.spec.layer_windows)}

    def _new_cache(self) -> KVCache:
        spec = self.spec
        return KVCache(spec.num_layers, spec.num_kv_heads, spec.head_dim, spec.max_context, self.dtype, self.device)

    @property
    def _rope_capacity(self) -> int:
        return next(iter(self._rope.values())).cos.shape[0]

    def _rope_tables(self, capacity: int) -> dict[str, RopeTable]:
        return {key: RopeTable.build(freqs, capacity, self.dtype, self.device) for key, freqs in self.spec.rope.items()}


def _length(rows: slice) -> int:
    return rows.stop - rows.start
