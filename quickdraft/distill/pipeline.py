"""`quickdraft distill` end to end: data, vocabulary, training, evaluation, output directory.

Layout of the output directory:

    DIR/data/           token shards of self-generated answers, written by the batched engine (data.py)
    DIR/states/         the target's states for them, recomputed by batched forwards (states.py)
    DIR/train/          vocab.json (fixed at the first training run) and checkpoint.safetensors
    DIR/config.json, DIR/model.safetensors, DIR/quickdraft.json, DIR/README.md   the head (kind "head",
                        in the speculators layout: drafters/head/files.py)
    DIR/standalone/     a transformers model directory (kind "standalone")
    DIR/table.safetensors   the answers counted into a corpus table (kind "table": no states, no training)

Every stage resumes: data appends shards up to --tokens, states fill in the missing shards, training
continues from its checkpoint.
"""

import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from quickdraft.config import SpecConfig
from quickdraft.distill import card, evaluation
from quickdraft.distill.data import AnswerConfig, generate_shards, load_shards, shard_files, writing_rate
from quickdraft.distill.prompts import load_training_prompts
from quickdraft.distill.states import ensure_states, states_seconds
from quickdraft.distill.table import write_table
from quickdraft.distill.train import (
    HELDOUT_EVERY,
    HeadObjective,
    TrainConfig,
    Trainer,
    answer_tokens,
    evaluate,
    split_examples,
)
from quickdraft.distill.vocab import VocabChoice, choose_vocab, count_tokens, coverage, prompt_counts
from quickdraft.drafters.corpus import MAX_ORDER, MIN_COUNT
from quickdraft.drafters.head.files import build_head, load_head, save_head
from quickdraft.drafters.head.identity import target_identity
from quickdraft.drafters.head.model import DraftHead, HeadConfig, default_aux_layers
from quickdraft.engine import Engine
from quickdraft.errors import UsageError
from quickdraft.models.loading import LoadedModel, load_model
from quickdraft.models.registry import hub_name
from quickdraft.models.single_slot import batch_view

Kind = Literal["head", "standalone", "table"]
TABLE_FILE = "table.safetensors"


@dataclass(frozen=True)
class DistillOptions:
    target: str  # model name or path
    out: Path
    prompts: Path | None = None  # None: the built-in ShareGPT prompts
    tokens: int = 50_000  # answer tokens to generate (data stage stops once reached)
    vocab: int | None = None  # reduced vocabulary size; None: smallest covering 98% of held-out answer tokens
    intermediate_size: int | None = None  # the head's MLP width; None: the target's
    resume: bool = False
    kind: Kind = "head"
    generation: AnswerConfig = field(default_factory=AnswerConfig)
    training: TrainConfig = field(default_factory=TrainConfig)
    init_head: Path | None = None  # start from this head's weights and vocabulary instead of a fresh head
    eval_prompts: int = (
        30  # held-out prompts answered by the engine with the head, for the card (per-prompt tau spreads 1.1-5.0)
    )
    command: str = ""  # the command line, recorded in the card


def distill(options: DistillOptions) -> Path:
    """Run every stage; returns the directory of the result."""
    _check_out(options)
    started = time.perf_counter()
    target = load_model(options.target)  # the default runtime: the answers are those the engine's target writes
    prompts = load_training_prompts(options.prompts)
    identity = target_identity(target)
    _say(
        f"{len(prompts)} training prompts (Spec-Bench prompts removed); generating up to {options.tokens} answer tokens"
    )
    generate_shards(
        lambda: Engine(target, SpecConfig(drafter="none"), max_batch=options.generation.batch_size),
        prompts,
        options.out / "data",
        options.tokens,
        options.generation,
        identity,
        progress=_data_progress(time.perf_counter()),
    )
    if options.kind == "table":
        table = write_table(options.out / "data", options.out / TABLE_FILE, MAX_ORDER, MIN_COUNT)
        _say(f"table: {table.keys.numel()} contexts from {table.answer_tokens} answer tokens")
        return options.out / TABLE_FILE
    shards = load_shards(options.out / "data")
    start = load_head(options.init_head, target) if options.init_head else None  # the head a fine-tune starts from
    num_layers = target.config.get_text_config().num_hidden_layers
    aux_layers = start.config.aux_layers if start is not None else default_aux_layers(num_layers)
    states = ensure_states(
        options.out / "data",
        options.out / "states",
        lambda: batch_view(target.runner)[0],
        aux_layers,
        num_layers,
        identity,
        progress=lambda done, total: _say(f"states: {done}/{total} shards"),
    )
    if options.kind == "standalone":
        from quickdraft.distill.standalone import train_standalone

        return train_standalone(target, shards, states, options)
    vocab = _vocab(target, shards, prompts, start, options)
    _say(
        f"reduced vocabulary: {len(vocab.ids)} tokens, covering {vocab.heldout_coverage:.2%} of held-out answer tokens"
    )
    shapes = start.config if start is not None else _shapes(target, len(vocab.ids), options)
    return _train_head(target, shards, states, vocab, shapes, start, identity, prompts, options, started)


def _shapes(target: LoadedModel, draft_vocab: int, options: DistillOptions) -> HeadConfig:
    """A fresh head: one decoder layer like the target's (MLP `--intermediate-size` wide), EAGLE-3's states."""
    text = target.config.get_text_config()
    return HeadConfig.like_target(text, draft_vocab, options.intermediate_size)


def _train_head(
    target: LoadedModel,
    shards,
    states,
    vocab: VocabChoice,
    shapes: HeadConfig,
    start: DraftHead | None,
    identity: dict,
    prompts: list[str],
    options: DistillOptions,
    started: float,
) -> Path:
    head = build_head(shapes, target, vocab.ids)
    _, target_output = target.runner.embedding_matrices()
    train, heldout = split_examples(shards, states, options.training.train_on_prompts)
    trainer = Trainer(
        HeadObjective(head, target_output, options.training),
        train,
        heldout,
        options.training,
        options.out / "train" / "checkpoint.safetensors",
    )
    if options.resume and trainer.resume():
        _say(f"resuming training at step {trainer.state.step} of {trainer.total_steps}")
    elif start is not None:
        head.load_state_dict(start.state_dict())
        _say(f"starting from the head in {options.init_head}")
    # held-out metrics training must beat: the starting head's, else a fresh head's
    baseline = (
        evaluate(start, target_output, heldout, options.training)
        if start is not None
        else evaluation.untrained_metrics(target, shapes, vocab.ids, heldout, options.training)
    )
    metrics = trainer.run()
    head.eval()
    extra = {"vocab_coverage": {"train": vocab.train_coverage, "heldout": vocab.heldout_coverage}, "heldout": metrics}
    save_head(options.out, head, identity, verifier=hub_name(options.target), **extra)
    eval_prompts = evaluation.heldout_prompts(prompts, options.eval_prompts)
    _say(f"measuring the saved head with the engine (default runtime) on {len(eval_prompts)} held-out prompts")
    measured = evaluation.engine_metrics(target, options.out, eval_prompts, options.generation.max_new_tokens)
    save_head(options.out, head, identity, verifier=hub_name(options.target), **extra, engine=measured)
    facts = card.Facts(
        target=options.target,
        identity=identity,
        data=card.data_facts(shards, shard_files(options.out / "data"), train, heldout),
        vocab=vocab,
        generation=options.generation,
        training=options.training,
        train_seconds=trainer.state.seconds,
        total_seconds=time.perf_counter() - started,
        heldout=metrics,
        baseline=baseline,
        engine=measured,
        aux_layers=shapes.aux_layers,
        runtime=card.runtime_words(target),
        data_seconds=writing_rate(options.out / "data")[1],
        states_seconds=states_seconds(options.out / "data", options.out / "states"),
        command=options.command,
        parameters=sum(p.numel() for p in head.parameters()),
        init_head=str(options.init_head) if options.init_head else None,
    )
    (options.out / "README.md").write_text(card.render(facts))
    _say(
        f"head written to {options.out}: held-out tau@{metrics['k']} {metrics['tau']:.2f} (teacher-forced), "
        f"engine tau {measured['tau']:.2f}"
    )
    return options.out


def _vocab(
    target: LoadedModel, shards, prompts: list[str], start: DraftHead | None, options: DistillOptions
) -> VocabChoice:
    """The reduced vocabulary, chosen once and kept for resumed runs (an --init-head run keeps that head's)."""
    path = options.out / "train" / "vocab.json"
    train_answers, heldout_answers = answer_tokens(shards)
    train_counts = count_tokens(train_answers, target.info.vocab_size)
    heldout_counts = count_tokens(heldout_answers, target.info.vocab_size)
    if not path.exists() and start is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"ids": start.vocab_ids.tolist()}))
    if path.exists():
        ids = torch.tensor(json.loads(path.read_text())["ids"], dtype=torch.long)  # [draft_vocab], in its own order
        return VocabChoice(ids, coverage(ids, train_counts), coverage(ids, heldout_counts))
    training_prompts = [p for i, p in enumerate(prompts) if i % HELDOUT_EVERY != 0]
    prior = prompt_counts(target.tokenizer, training_prompts, target.info.vocab_size)
    vocab = choose_vocab(
        train_counts, heldout_counts, options.vocab, forced=sorted(target.info.eos_token_ids), prior_counts=prior
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"ids": vocab.ids.tolist()}))
    return vocab


def _check_out(options: DistillOptions) -> None:
    if options.out.exists() and any(options.out.iterdir()) and not options.resume:
        raise UsageError(f"{options.out} is not empty; pass --resume to continue that run, or choose a new --out")


def _data_progress(started: float):
    def report(done: int, goal: int) -> None:
        _say(f"data: {done}/{goal} answer tokens after {time.perf_counter() - started:.0f} s")

    return report


def _say(message: str) -> None:
    print(f"distill: {message}", file=sys.stderr, flush=True)
