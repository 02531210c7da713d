"""Training the head on the target's own states, with a held-out split and resumable checkpoints.

Each sequence of T tokens gives pairs t = 0..T-2: input (a_t, x_{t+1}), target the target's
next-token distribution at position t+1, softmax(output rows @ f_{t+1}) renormalised over the
reduced vocabulary. Only pairs that predict answer positions count (t >= answer_start - 1), and,
as in EAGLE-3, only where the target's own choice lies inside the reduced vocabulary (elsewhere no
draft can be right). The loss of drafting step s (training-time test, see `DraftHead.unrolled`) is
the cross-entropy from that distribution to the head's, at the position step s drafts; step s
weighs `step_decay` ** (s - 1). The learning rate warms up, then follows a cosine to zero over the
run's progress: the larger of the step fraction and the fraction of the time budget used.

Held-out metrics are teacher-forced: the draft token of step s at position t is right when it
equals the target's greedy token there; a draft starting at t is accepted up to the first wrong
step, which gives acceptance by position (each position given the one before), alpha and tau for
k = `eval_k`.
"""

import ctypes
import math
import random
import re
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal, Protocol

import torch
import torch.nn.functional as F
from tqdm import tqdm

from quickdraft.distill.checkpoint import load_checkpoint, save_checkpoint
from quickdraft.distill.data import Shard
from quickdraft.distill.states import ShardStates
from quickdraft.drafters.head.model import DraftHead
from quickdraft.errors import UsageError

HELDOUT_EVERY = 20  # prompt index % HELDOUT_EVERY == 0 goes to the held-out split (5%)


@dataclass(frozen=True)
class TrainConfig:
    epochs: float = 4.0  # passes over the training split
    minutes: float | None = None  # wall-clock cap on training (progress and lr schedule follow it)
    batch_sequences: int = 8
    lr: float = 1e-3
    warmup_steps: int = 20
    unroll: int = 4  # drafting steps simulated in training (training-time test; 1 = teacher forcing only)
    step_decay: float = 0.8  # weight of step s is step_decay ** (s - 1) (EAGLE-3's 0.8)
    weight_decay: float = 0.0  # AdamW decoupled weight decay
    train_on_prompts: bool = False  # also count the prompts' pairs in training (held-out stays answers only)
    eval_k: int = 4
    eval_every: int = 50  # steps between held-out evaluations
    eval_sequences: int = 64  # held-out sequences scored during training (the final evaluation scores all)
    checkpoint_seconds: float = 120.0
    seed: int = 0
    precision: str = "auto"  # the head's training products, one of PRECISIONS (see `bfloat16_products`)


PRECISIONS = ("auto", "float32", "bfloat16")  # bfloat16: CPU autocast; auto: bfloat16 where the CPU has it natively


def bfloat16_products(precision: str) -> bool:
    """Whether the head trains with its products in bfloat16 (CPU autocast: weights, optimizer state and the
    softmaxes stay float32). "auto": where the CPU multiplies bfloat16 natively (its /proc/cpuinfo flags name
    avx512_bf16 or amx_bf16), where with `keep_freed_memory` a training step runs 2.4x faster (BENCHMARKS.md,
    "Training in bfloat16"); elsewhere bfloat16 products are emulated and slower than float32."""
    if precision not in PRECISIONS:
        raise UsageError(f"training precision must be auto, float32 or bfloat16, got {precision!r}")
    if precision != "auto":
        return precision == "bfloat16"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return re.search(r"\b(avx512_bf16|amx_bf16)\b", flags) is not None


def keep_freed_memory() -> None:
    """Have glibc serve every allocation from its heap and keep what is freed there (mallopt; elsewhere nothing).

    A training step allocates the same large temporaries again and again (logits over the draft vocabulary: 50 MB
    for 1,000 positions). glibc maps each one fresh from the kernel and unmaps it when freed, so every step
    faults in and zeroes them anew: with bfloat16 products that took 40% of a smollm2 head's step
    (BENCHMARKS.md, "Training in bfloat16"). Reused from the heap they cost nothing after the first step. The
    process keeps its peak memory until it exits, which a training run reaches in its first step anyway."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_max = -1, -4  # mallopt's parameter numbers (malloc.h)
    libc.mallopt(m_mmap_max, 0)
    libc.mallopt(m_trim_threshold, 2**31 - 1)


@dataclass(frozen=True)
class Example:
    """One sequence as training pairs."""

    tokens: torch.Tensor  # [L] x_0..x_{L-1}, L = T - 1
    aux: torch.Tensor  # [L, 3 * d] a_0..a_{L-1} (stored dtype): the head's inputs
    final: torch.Tensor  # [T, d] f_0..f_{L}: the target's final-norm state at every position (stored dtype)
    next_tokens: torch.Tensor  # [L] x_1..x_L
    greedy_next: torch.Tensor  # [L] x_2..x_{L+1}; -1 where unknown (the last pair)
    first_pair: int  # the first pair that counts (answer_start - 1: it predicts the first answer token's successor)


def split_examples(
    shards: list[Shard], states: list[ShardStates], train_on_prompts: bool = False
) -> tuple[list[Example], list[Example]]:
    """(training, held-out) examples; a prompt's sequence goes to one split only.

    Held-out examples count answer pairs only; training examples also count the prompt's pairs
    when `train_on_prompts` (the target's states on user text: more data, same dynamics).
    """
    train, heldout = [], []
    for shard, shard_states in zip(shards, states):
        offset = 0
        for prompt_index, tokens, answer_start in shard.sequences():
            end = offset + len(tokens)
            aux, final = shard_states.aux[offset:end], shard_states.final[offset:end]
            offset = end
            split = split_of(prompt_index, shard.answer_pass)
            if len(tokens) - answer_start < 2 or split is None:
                continue
            if split == "heldout":
                heldout.append(make_example(tokens, aux, final, answer_start))
            else:
                train.append(make_example(tokens, aux, final, 1 if train_on_prompts else answer_start))
    return train, heldout


def split_of(prompt_index: int, answer_pass: int) -> Literal["train", "heldout"] | None:
    """Where a sequence goes: the other prompts' answers (every pass) train; a held-out prompt's greedy answer
    (pass 0) is held out; its sampled answers go nowhere, so held-out figures stay on greedy answers and no
    held-out prompt is trained on."""
    if prompt_index % HELDOUT_EVERY != 0:
        return "train"
    return "heldout" if answer_pass == 0 else None


def answer_tokens(shards: list[Shard]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Answer token ids per sequence, (training split, held-out split)."""
    train, heldout = [], []
    for shard in shards:
        for prompt_index, tokens, answer_start in shard.sequences():
            split = split_of(prompt_index, shard.answer_pass)
            if split is not None:
                (heldout if split == "heldout" else train).append(tokens[answer_start:])
    return train, heldout


def make_example(tokens: torch.Tensor, aux: torch.Tensor, final: torch.Tensor, counted_from: int) -> Example:
    """Pairs of one sequence; pairs predicting positions >= counted_from count in the loss."""
    greedy_next = torch.cat([tokens[2:], torch.tensor([-1])])
    return Example(tokens[:-1], aux[:-1], final, tokens[1:], greedy_next, max(counted_from - 1, 0))


@dataclass
class Batch:
    tokens: torch.Tensor  # [B, L]
    aux: torch.Tensor  # [B, L, 3 * d] float32
    final: torch.Tensor  # [B, L, d] float32: f_t, the state that predicts x_{t+1} (a standalone draft's target)
    targets: torch.Tensor  # [B, L, d] float32: f_{t+1}, the state whose distribution pair t's draft imitates
    next_tokens: torch.Tensor  # [B, L]
    greedy_next: torch.Tensor  # [B, L], -1 = unknown
    mask: torch.Tensor  # [B, L] bool: pairs that count


def make_batch(examples: list[Example]) -> Batch:
    length = max(len(e.next_tokens) for e in examples)
    pad = lambda t, value=0: F.pad(t, (0, 0) * (t.dim() - 1) + (0, length - t.shape[0]), value=value)  # noqa: E731
    positions = torch.arange(length)
    return Batch(
        tokens=torch.stack([pad(e.tokens) for e in examples]),
        aux=torch.stack([pad(e.aux.float()) for e in examples]),
        final=torch.stack([pad(e.final[:-1].float()) for e in examples]),
        targets=torch.stack([pad(e.final[1:].float()) for e in examples]),
        next_tokens=torch.stack([pad(e.next_tokens) for e in examples]),
        greedy_next=torch.stack([pad(e.greedy_next, -1) for e in examples]),
        mask=torch.stack([(positions >= e.first_pair) & (positions < len(e.next_tokens)) for e in examples]),
    )


def step_losses(
    head: DraftHead, target_output: torch.Tensor, batch: Batch, steps: int, step_decay: float
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(the steps' weighted loss, each step's draft token ids [B, L] as target ids).

    `target_output` [draft_vocab, d]: the target's output rows of the reduced vocabulary. Logits are
    computed only at the pairs that count (every step's pairs are a subset of `batch.mask`, step s
    also needs t >= s-1), which skips the prompt positions. Pair t of step s drafts position t + 1
    after s - 1 draft tokens, so its target is f_{t+1} like step 1's at the same pair.
    """
    counted = batch.mask.nonzero(as_tuple=True)  # ([N], [N])
    positions = counted[1]  # [N]
    with torch.no_grad():
        target_probs = torch.softmax((batch.targets[counted] @ target_output.T).float(), -1)  # [N, V]
    total, weights, drafted = 0.0, 0.0, []
    stream = head.fuse(batch.aux)  # [B, L, d]
    for step, out in enumerate(head.unrolled(stream, batch.next_tokens, steps), start=1):
        valid = (positions >= step - 1).float()  # [N]
        logits = head.draft_logits(out[counted]).float()  # [N, V]: the softmaxes in float32 under autocast too
        ce = -(target_probs * torch.log_softmax(logits, -1)).sum(-1)  # [N]
        weight = step_decay ** (step - 1)
        total = total + weight * (ce * valid).sum() / valid.sum().clamp_min(1)
        weights += weight
        step_ids = torch.full_like(batch.next_tokens, -1)  # [B, L]
        step_ids[counted] = head.vocab_ids[logits.detach().argmax(-1)]
        drafted.append(step_ids)
    return total / weights, drafted


def inside_vocab(batch: Batch, inside: torch.Tensor) -> Batch:
    """The batch without the pairs whose next greedy token (the target's own choice on an answer) lies outside the
    reduced vocabulary (`inside` [target_vocab] bool); the last pair, whose next token is unknown, stays."""
    known = batch.greedy_next >= 0
    return replace(batch, mask=batch.mask & (~known | inside[batch.greedy_next.clamp_min(0)]))


@dataclass
class TrainState:
    """Everything a checkpoint restores."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    seconds: float = 0.0
    last_eval: dict | None = None


class Objective(Protocol):
    """What the trainer optimises: a model, its loss on a batch of examples, held-out metrics."""

    model: torch.nn.Module

    def loss(self, examples: list[Example]) -> torch.Tensor: ...

    def evaluate(self, examples: list[Example]) -> dict: ...


class HeadObjective:
    """The head's loss (`step_losses`) over `unroll` drafting steps; teacher-forced held-out metrics.

    `target_output` [target_vocab, d]: the target's output layer (its rows of the reduced vocabulary give
    the distributions the head learns)."""

    def __init__(self, head: DraftHead, target_output: torch.Tensor, config: TrainConfig) -> None:
        self.model, self.config = head, config
        self.bfloat16 = bfloat16_products(config.precision)
        self.target_output = target_output.float()  # [target_vocab, d]
        self.draft_output = self.target_output[head.vocab_ids]  # [draft_vocab, d]
        self.inside = torch.zeros(target_output.shape[0], dtype=torch.bool)  # [target_vocab]
        self.inside[head.vocab_ids] = True

    def loss(self, examples: list[Example]) -> torch.Tensor:
        batch = inside_vocab(make_batch(examples), self.inside)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bfloat16):
            return step_losses(self.model, self.draft_output, batch, self.config.unroll, self.config.step_decay)[0]

    def evaluate(self, examples: list[Example]) -> dict:
        return evaluate(self.model, self.target_output, examples, self.config)


class Trainer:
    """Runs epochs over the training split with progress, held-out evaluation and checkpoints."""

    def __init__(
        self, objective: Objective, train: list[Example], heldout: list[Example], config: TrainConfig, checkpoint: Path
    ) -> None:
        """`checkpoint`: the .safetensors file progress is saved to and resumed from (see `distill/checkpoint.py`)."""
        self.objective, self.train, self.heldout, self.config = objective, train, heldout, config
        self.checkpoint = checkpoint
        parameters = [p for p in objective.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(parameters, lr=config.lr, weight_decay=config.weight_decay)
        self.state = TrainState()
        self.batches_per_epoch = math.ceil(len(train) / config.batch_sequences)
        self.total_steps = max(1, int(config.epochs * self.batches_per_epoch))
        self._last_loss = float("nan")

    def resume(self) -> bool:
        """Load the checkpoint if there is one; True when training continues from it."""
        pickled = self.checkpoint.with_suffix(".pt")
        if not self.checkpoint.exists() and pickled.exists():
            raise UsageError(
                f"{pickled} is a pickle checkpoint of an older quickdraft, which is never loaded (unpickling can run "
                "any code); delete it to train from the start"
            )
        if not self.checkpoint.exists():
            return False
        progress = load_checkpoint(self.checkpoint, self.objective.model, self.optimizer)
        self.state = TrainState(**progress)
        return True

    def run(self) -> dict:
        """Train to the end of the schedule (or the time cap); returns the final held-out metrics."""
        keep_freed_memory()
        bar = tqdm(total=self.total_steps, initial=self.state.step, desc="train", unit="step", dynamic_ncols=True)
        started, saved_at = time.perf_counter() - self.state.seconds, time.perf_counter()
        while self._progress() < 1.0:
            self._train_step(self._next_examples())
            self.state.seconds = time.perf_counter() - started
            bar.update(1)
            bar.set_postfix(loss=f"{self._last_loss:.4f}", heldout=_short(self.state.last_eval))
            if self.state.step % self.config.eval_every == 0:
                self.state.last_eval = self.objective.evaluate(self.heldout[: self.config.eval_sequences])
            if time.perf_counter() - saved_at > self.config.checkpoint_seconds:
                self.save_checkpoint()
                saved_at = time.perf_counter()
        bar.close()
        self.state.last_eval = self.objective.evaluate(self.heldout)
        self.save_checkpoint()
        return self.state.last_eval

    def _progress(self) -> float:
        by_steps = self.state.step / self.total_steps
        by_time = self.state.seconds / (60 * self.config.minutes) if self.config.minutes else 0.0
        return max(by_steps, by_time)

    def _learning_rate(self) -> float:
        if self.state.step < self.config.warmup_steps:
            return self.config.lr * (self.state.step + 1) / self.config.warmup_steps
        return self.config.lr * 0.5 * (1 + math.cos(math.pi * min(self._progress(), 1.0)))

    def _train_step(self, examples: list[Example]) -> None:
        self.objective.model.train()
        for group in self.optimizer.param_groups:
            group["lr"] = self._learning_rate()
        loss = self.objective.loss(examples)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.objective.model.parameters(), 1.0)
        self.optimizer.step()
        self._last_loss = float(loss.detach())
        self.state.step += 1

    def _next_examples(self) -> list[Example]:
        """The next batch of the epoch; epochs shuffle sequences (seeded), batching similar lengths."""
        if self.state.batch_in_epoch >= self.batches_per_epoch:
            self.state.epoch += 1
            self.state.batch_in_epoch = 0
        batches = _epoch_batches(self.train, self.config.batch_sequences, self.config.seed + self.state.epoch)
        chosen = batches[self.state.batch_in_epoch]
        self.state.batch_in_epoch += 1
        return [self.train[i] for i in chosen]

    def save_checkpoint(self) -> None:
        self.checkpoint.parent.mkdir(parents=True, exist_ok=True)
        save_checkpoint(self.checkpoint, self.objective.model, self.optimizer, asdict(self.state))


def _short(metrics: dict | None) -> str:
    if not metrics:
        return "-"
    return f"tau {metrics['tau']:.2f}" if "tau" in metrics else f"loss {metrics['loss']:.3f}"


def _epoch_batches(examples: list[Example], batch_size: int, seed: int) -> list[list[int]]:
    count = len(examples)
    order = list(range(count))
    random.Random(seed).shuffle(order)
    window = batch_size * 16  # sort within windows so batches hold similar lengths
    batches = []
    for start in range(0, count, window):
        group = sorted(order[start : start + window], key=lambda i: len(examples[i].next_tokens))
        batches += [group[i : i + batch_size] for i in range(0, len(group), batch_size)]
    random.Random(seed + 1).shuffle(batches)
    return batches


@torch.no_grad()
def evaluate(head: DraftHead, target_output: torch.Tensor, examples: list[Example], config: TrainConfig) -> dict:
    """Held-out loss and teacher-forced acceptance: by position, alpha and tau at k = eval_k."""
    head.eval()
    k, losses, accepted_lengths = config.eval_k, [], []
    draft_output = target_output.float()[head.vocab_ids]  # [draft_vocab, d]
    for start in range(0, len(examples), config.batch_sequences):
        batch = make_batch(examples[start : start + config.batch_sequences])
        loss, drafted = step_losses(head, draft_output, batch, k, config.step_decay)
        losses.append(float(loss))
        accepted_lengths.append(_accepted_lengths(batch, drafted))
    lengths = torch.cat(accepted_lengths) if accepted_lengths else torch.zeros(0)  # [drafts]
    by_position = [
        float((lengths >= s).float().mean()) / max(float((lengths >= s - 1).float().mean()), 1e-9)
        for s in range(1, k + 1)
    ]
    mean_accepted = float(lengths.float().mean()) if len(lengths) else 0.0
    return {
        "loss": sum(losses) / max(len(losses), 1),
        "k": k,
        "acceptance_by_position": [round(a, 4) for a in by_position],
        "alpha": round(mean_accepted / k, 4),
        "tau": round(1 + mean_accepted, 4),
        "drafts": len(lengths),
    }


def _accepted_lengths(batch: Batch, drafted: list[torch.Tensor]) -> torch.Tensor:
    """Accepted draft length for a draft starting at every valid answer position: [drafts].

    drafted[s]: [B, L] the target id drafted by step s+1 at each pair (-1 where not computed).
    """
    length = batch.mask.shape[1]
    k = len(drafted)
    usable = length - k + 1
    if usable <= 0:
        return torch.zeros(0, dtype=torch.long)
    right = [
        (drafted[s][:, s : s + usable] == batch.greedy_next[:, s : s + usable]) for s in range(k)
    ]  # each [B, usable]
    leading = torch.stack(right, -1).long().cumprod(-1).sum(-1)  # [B, usable]
    starts = batch.mask[:, :usable] & (batch.greedy_next[:, k - 1 : k - 1 + usable] >= 0)
    return leading[starts]
