"""`quickdraft distill` end to end on a tiny random target, and its parts: prompts, data, vocabulary, training."""

import json
import math
import os
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from quickdraft.cli import main
from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.distill import data as data_module
from quickdraft.distill.data import AnswerConfig, generate_shards, load_shards
from quickdraft.distill.pipeline import DistillOptions, distill
from quickdraft.distill.prompts import drop_evaluation_prompts, load_training_prompts, specbench_turns
from quickdraft.distill.states import ensure_states, shard_states, states_seconds
from quickdraft.distill.train import (
    HeadObjective,
    TrainConfig,
    Trainer,
    answer_tokens,
    bfloat16_products,
    evaluate,
    split_examples,
    split_of,
)
from quickdraft.distill.vocab import choose_vocab, count_tokens
from quickdraft.drafters.corpus import load_table
from quickdraft.drafters.head.files import build_head, load_head
from quickdraft.drafters.head.identity import target_identity
from quickdraft.drafters.head.model import HeadConfig, default_aux_layers
from quickdraft.engine import Engine
from quickdraft.errors import UsageError
from quickdraft.models.loading import load_model, load_model_dir
from quickdraft.models.single_slot import batch_view

WORDS = (
    "the quick brown fox jumps over lazy dog speculative decoding drafts tokens once upon a time small model fast"
).split()
TINY_GENERATION = AnswerConfig(max_new_tokens=24, batch_size=8, chunk_prompts=16)
TINY_TRAINING = TrainConfig(
    epochs=20, batch_sequences=4, lr=1e-2, warmup_steps=5, unroll=2, eval_every=1000, eval_k=3, precision="float32"
)  # float32 products on every CPU: the tests below measured their margins in float32


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    lines = [" ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(3 + i % 5)) for i in range(48)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def distilled(tiny_dirs, prompts_file, tmp_path_factory):
    """A head distilled from the tiny Llama: (options, output directory)."""
    options = DistillOptions(
        target=str(tiny_dirs["llama"]),
        out=tmp_path_factory.mktemp("distill") / "run",
        prompts=prompts_file,
        tokens=500,
        generation=TINY_GENERATION,
        training=TINY_TRAINING,
        eval_prompts=2,
        command="test",
    )
    return options, distill(options)


def test_distill_writes_a_loadable_head_with_config_and_card(distilled, tiny_models):
    options, out = distilled
    config = json.loads((out / "config.json").read_text())
    meta = json.loads((out / "quickdraft.json").read_text())
    assert config["speculators_model_type"] == "eagle3" and meta["target"]["vocab_size"] == 320
    head = load_head(out, tiny_models["llama"])
    assert config["draft_vocab_size"] == len(head.vocab_ids) > 0
    assert 1 in head.vocab_ids.tolist()  # end of sequence is always draftable
    assert meta["engine"]["identical"] is True
    card = (out / "README.md").read_text()
    assert "held-out tau@3" in card and "answer tokens" in card and "```\ntest\n```" in card
    assert "min of training, its products in float32." in card
    assert "EAGLE-3" in card and "written by the batched engine" in card
    assert "shards (shard-00000.safetensors" in card and "Their states were recomputed in" in card
    engine = Engine(tiny_models["llama"], SpecConfig(drafter=f"head:{out}", k=3))
    expected = Engine(tiny_models["llama"], SpecConfig(drafter="none")).generate(
        "the quick brown fox", SamplingParams(max_new_tokens=20)
    )
    assert engine.generate("the quick brown fox", SamplingParams(max_new_tokens=20)).token_ids == expected.token_ids


def no_runner():
    raise AssertionError("the runner was loaded although every shard's states are cached")


def examples(out, train_on_prompts=False):
    """(training, held-out) examples of the distilled data, with the states the distill cached beside it."""
    identity = json.loads((out / "data" / "manifest.json").read_text())["target"]
    states = ensure_states(out / "data", out / "states", no_runner, default_aux_layers(2), 2, identity)
    return split_examples(load_shards(out / "data"), states, train_on_prompts)


def test_trained_head_beats_an_untrained_one_on_its_training_distribution(distilled, tiny_models):
    options, out = distilled
    target = tiny_models["llama"]
    train, _ = examples(out)
    trained = load_head(out, target)
    torch.manual_seed(0)
    untrained = build_head(trained.config, target, trained.vocab_ids)
    _, output = target.runner.embedding_matrices()
    trained_metrics = evaluate(trained, output, train, TINY_TRAINING)
    untrained_metrics = evaluate(untrained, output, train, TINY_TRAINING)
    assert trained_metrics["loss"] < untrained_metrics["loss"]
    assert trained_metrics["tau"] > untrained_metrics["tau"] + 0.5


def test_training_time_test_raises_later_position_acceptance_over_teacher_forcing(distilled, tiny_models, tmp_path):
    """The same head trained with T = 4 unrolled steps and with T = 1 (teacher forcing only), same data, seed and
    steps: with T = 4 more drafts reach positions 2, 3 and 4 on its own data, where the head reads its own outputs
    (measured: T = 1 reaches them in 1.9%, 1.0%, 0.5% of drafts, T = 4 in 20%, 7.7%, 2.6%; with half the steps
    T = 4 is not yet ahead at position 3)."""
    target = tiny_models["llama"]
    config = replace(TINY_TRAINING, epochs=30, eval_k=4)
    reach = {}
    for unroll in (1, 4):
        trainer = head_trainer(distilled, target, tmp_path / f"t{unroll}.safetensors", replace(config, unroll=unroll))
        trainer.run()
        given_previous = trainer.objective.evaluate(trainer.train)["acceptance_by_position"]
        reach[unroll] = [math.prod(given_previous[:position]) for position in range(1, 5)]  # share reaching each
    assert all(later_4 > 2 * later_1 for later_4, later_1 in zip(reach[4][1:], reach[1][1:])), reach


def test_states_are_the_targets_own_from_solo_forwards_and_cached_per_shard(distilled, tiny_dirs, tmp_path):
    """Batched state forwards give each sequence exactly its solo prefill's states (every layer asked for); a
    second run reads the cache and loads no runner; states of other layers are refused, not mixed."""
    options, out = distilled
    target = load_model(options.target)
    runner = batch_view(target.runner)[0]
    shard = load_shards(out / "data")[0]
    layers = (*default_aux_layers(2), 2)
    batched = shard_states(runner, shard, layers)  # [N, 4 * d]
    solo = torch.cat(
        [target.runner.prefill(tokens.tolist(), hidden_layers=layers)[1] for _, tokens, _ in shard.sequences()]
    ).to(batched.dtype)
    assert torch.equal(batched, solo)
    identity = target_identity(target)
    cached = ensure_states(out / "data", tmp_path / "states", lambda: runner, default_aux_layers(2), 2, identity)
    again = ensure_states(out / "data", tmp_path / "states", no_runner, default_aux_layers(2), 2, identity)
    assert all(torch.equal(a.aux, b.aux) and torch.equal(a.final, b.final) for a, b in zip(cached, again))
    seconds = states_seconds(out / "data", tmp_path / "states")  # recorded when computed, kept by the rerun
    assert seconds is not None and seconds >= 0
    d = batched.shape[1] // 4
    assert torch.equal(cached[0].aux, batched[:, : 3 * d]) and torch.equal(cached[0].final, batched[:, 3 * d :])
    with pytest.raises(UsageError, match="states of other layers or another target; delete it"):
        ensure_states(out / "data", tmp_path / "states", no_runner, (0, 0, 1), 2, identity)


def test_rerun_without_resume_is_refused_and_resume_extends_data_and_training(distilled, monkeypatch):
    """Resuming writes only the missing shards and trains only the missing steps (a restart from scratch would
    write every shard again, identical bytes and all, and retrain every step)."""
    options, out = distilled
    with pytest.raises(UsageError, match="--resume"):
        distill(options)
    manifest = json.loads((out / "data" / "manifest.json").read_text())
    first_shard = (out / "data" / manifest["shards"][0]["file"]).read_bytes()
    steps_before = checkpoint_progress(out / "train" / "checkpoint.safetensors")["step"]
    more = replace(options, resume=True, tokens=options.tokens + 300, training=replace(TINY_TRAINING, epochs=22))
    calls = {"shards": 0, "steps": 0}
    write_shard, train_step = data_module.answer_chunk, Trainer._train_step

    def counted_shard(*args, **kwargs):
        calls["shards"] += 1
        return write_shard(*args, **kwargs)

    def counted_step(self, examples):
        calls["steps"] += 1
        return train_step(self, examples)

    monkeypatch.setattr(data_module, "answer_chunk", counted_shard)
    monkeypatch.setattr(Trainer, "_train_step", counted_step)
    distill(more)
    resumed = json.loads((out / "data" / "manifest.json").read_text())
    assert len(resumed["shards"]) > len(manifest["shards"])
    assert resumed["shards"][: len(manifest["shards"])] == manifest["shards"]
    assert (out / "data" / manifest["shards"][0]["file"]).read_bytes() == first_shard
    assert sum(s["answer_tokens"] for s in resumed["shards"]) >= more.tokens
    state = checkpoint_progress(out / "train" / "checkpoint.safetensors")
    assert state["step"] > steps_before
    assert calls == {"shards": len(resumed["shards"]) - len(manifest["shards"]), "steps": state["step"] - steps_before}


def test_complete_data_is_not_regenerated_and_loads_no_writer(distilled):
    options, out = distilled
    manifest = (out / "data" / "manifest.json").read_text()

    def no_writer():
        raise AssertionError("the writer model was loaded although the data is complete")

    identity = target_identity(load_model(options.target))
    total = generate_shards(
        no_writer, load_training_prompts(options.prompts), out / "data", options.tokens, options.generation, identity
    )
    assert total >= options.tokens
    assert (out / "data" / "manifest.json").read_text() == manifest


def checkpoint_progress(path) -> dict:
    """The trainer's progress in a checkpoint, read from its safetensors header alone."""
    with safe_open(str(path), framework="pt") as file:
        return json.loads(file.metadata()["quickdraft"])["progress"]


def head_trainer(distilled, target, checkpoint, config) -> Trainer:
    """A trainer of a fresh head (seeded) on the distilled data."""
    _, out = distilled
    train, heldout = examples(out)
    vocab_ids = load_head(out, target).vocab_ids
    torch.manual_seed(0)
    head = build_head(HeadConfig.like_target(target.config, len(vocab_ids)), target, vocab_ids)
    _, output = target.runner.embedding_matrices()
    return Trainer(HeadObjective(head, output, config), train, heldout, config, checkpoint)


def test_bfloat16_products_train_the_head_like_float32(distilled, tiny_models, tmp_path):
    """With its products in bfloat16 (autocast; weights, optimizer and softmaxes in float32) a batch's loss differs
    from float32's, so the products did change precision, by under 1%; trained the same steps, the head scores on
    its training data within a few percent of float32's."""
    target, metrics = tiny_models["llama"], {}
    for precision in ("float32", "bfloat16"):
        config = replace(TINY_TRAINING, precision=precision)
        trainer = head_trainer(distilled, target, tmp_path / f"{precision}.safetensors", config)
        metrics[precision] = float(trainer.objective.loss(trainer.train[:4]).detach())
        trainer.run()
        metrics[precision + " trained"] = trainer.objective.evaluate(trainer.train)
    assert metrics["bfloat16"] != metrics["float32"], metrics
    assert abs(metrics["bfloat16"] - metrics["float32"]) < 0.01 * metrics["float32"], metrics
    trained = metrics["bfloat16 trained"], metrics["float32 trained"]  # measured: tau 1.70 and 1.67, loss 5.05, 5.04
    for name, tolerance in (("loss", 0.02), ("tau", 0.05), ("alpha", 0.1)):
        assert trained[0][name] == pytest.approx(trained[1][name], rel=tolerance), metrics


def test_training_precision_is_checked():
    assert bfloat16_products("bfloat16") and not bfloat16_products("float32")
    with pytest.raises(UsageError, match="training precision must be auto, float32 or bfloat16"):
        bfloat16_products("float16")


def test_training_resumes_from_its_checkpoint(distilled, tiny_models, tmp_path):
    config = replace(TINY_TRAINING, epochs=1)
    first = head_trainer(distilled, tiny_models["llama"], tmp_path / "c.safetensors", config)
    first.run()
    second = head_trainer(distilled, tiny_models["llama"], tmp_path / "c.safetensors", replace(config, epochs=2))
    assert second.resume()
    assert second.state.step == first.state.step == first.batches_per_epoch
    torch.testing.assert_close(second.objective.model.fc.weight, first.objective.model.fc.weight)
    second.run()
    assert second.state.step == 2 * first.state.step
    assert second.state.epoch == 1


def test_an_interrupted_training_resumes_exactly_where_it_stopped(distilled, tiny_models, tmp_path, monkeypatch):
    """Stopped inside its second epoch and resumed from its last checkpoint, training ends bit for bit where the
    same training run without a stop ends: weights, optimizer moments, progress."""
    config = replace(TINY_TRAINING, epochs=2, checkpoint_seconds=0.0)  # a checkpoint after every step
    whole = head_trainer(distilled, tiny_models["llama"], tmp_path / "whole.safetensors", config)
    whole.run()
    stopped = head_trainer(distilled, tiny_models["llama"], tmp_path / "cut.safetensors", config)
    stop_at = stopped.batches_per_epoch + 2
    train_step = Trainer._train_step

    def step_unless_killed(self, examples):
        if self.state.step == stop_at:
            raise KeyboardInterrupt
        train_step(self, examples)

    monkeypatch.setattr(Trainer, "_train_step", step_unless_killed)
    with pytest.raises(KeyboardInterrupt):
        stopped.run()
    monkeypatch.undo()
    resumed = head_trainer(distilled, tiny_models["llama"], tmp_path / "cut.safetensors", config)
    assert resumed.resume() and resumed.state.step == stop_at
    resumed.run()
    assert (resumed.state.step, resumed.state.epoch, resumed.state.batch_in_epoch, resumed.state.last_eval) == (
        whole.state.step,
        whole.state.epoch,
        whole.state.batch_in_epoch,
        whole.state.last_eval,
    )
    for name, tensor in whole.objective.model.state_dict().items():
        assert torch.equal(resumed.objective.model.state_dict()[name], tensor), name
    for param, moments in whole.optimizer.state_dict()["state"].items():
        for key, value in moments.items():
            assert torch.equal(resumed.optimizer.state_dict()["state"][param][key], value), (param, key)


class RunsCode:
    """Unpickled, it creates the file `ran`: what a hostile pickle checkpoint could do instead."""

    def __init__(self, ran) -> None:
        self.ran = ran

    def __reduce__(self):
        return (Path.touch, (self.ran,))


def test_distill_killed_while_writing_data_resumes_losing_no_shard_and_reading_no_broken_one(tiny_dirs, tmp_path):
    """SIGKILL a real `quickdraft distill` once its data has shards, leave what a kill in the middle of a write
    leaves (the next shard half-written, under its temporary name and under its own), then resume."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(
        "\n".join(f"{i} " + " ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(3)) for i in range(1280))
    )
    out, data = tmp_path / "run", tmp_path / "run" / "data"
    command = [sys.executable, "-m", "quickdraft", "distill", "--target", str(tiny_dirs["llama"]), "--out", str(out)]
    command += ["--prompts", str(prompts), "--tokens", "1000000", "--max-new-tokens", "8", "--batch-size", "32"]
    command += ["--epochs", "1", "--eval-prompts", "1", "--threads", "1", "--resample-temperature", "0"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while listed_shards(data) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    assert process.wait(30) == -signal.SIGKILL, process.stderr.read().decode()
    finished = json.loads((data / "manifest.json").read_text())["shards"]
    assert 2 <= len(finished) < 5, "killed while there were still shards to write"
    kept = {entry["file"]: (data / entry["file"]).read_bytes() for entry in finished}
    next_shard = f"shard-{len(finished):05d}.safetensors"
    (data / f".{next_shard}.partial").write_bytes(kept[finished[0]["file"]][:1000])
    (data / next_shard).write_bytes(kept[finished[0]["file"]][:1000])

    resumed = subprocess.run([*command, "--resume"], env=env, capture_output=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr.decode()
    shards = json.loads((data / "manifest.json").read_text())["shards"]
    assert shards[: len(finished)] == finished and len(shards) == 5  # 1280 prompts, 256 per shard
    assert {name: (data / name).read_bytes() for name in kept} == kept
    indices = torch.cat([shard.prompt_indices for shard in load_shards(data)])  # prompts with a non-empty answer
    assert len(indices) == sum(entry["sequences"] for entry in shards) > 1200
    assert bool((indices[1:] > indices[:-1]).all()) and int(indices[-1]) >= 1024  # each prompt once, in order
    assert not list(data.glob("*.partial")) and (out / "model.safetensors").exists()


def listed_shards(data: Path) -> int:
    try:
        return len(json.loads((data / "manifest.json").read_text())["shards"])
    except (FileNotFoundError, json.JSONDecodeError):
        return 0


def test_a_checkpoint_from_someone_else_never_runs_code(tmp_path):
    """A pickle under any name, the old checkpoint.pt included, is refused unread: unpickling it would run code."""
    ran = tmp_path / "ran"

    def trainer(checkpoint) -> Trainer:
        return Trainer(SimpleNamespace(model=torch.nn.Linear(2, 2)), [], [], TINY_TRAINING, checkpoint)

    for name in ("checkpoint.pt", "checkpoint.safetensors"):
        (tmp_path / name).write_bytes(pickle.dumps({"model": RunsCode(ran)}))
        with pytest.raises(UsageError, match=f"{name} is not a quickdraft training checkpoint .*; delete it"):
            trainer(tmp_path / name).resume()
    older = tmp_path / "older.safetensors"
    older.with_suffix(".pt").write_bytes(pickle.dumps({"model": RunsCode(ran)}))
    with pytest.raises(
        UsageError, match="older.pt is a pickle checkpoint of an older quickdraft, which is never loaded"
    ):
        trainer(older).resume()
    assert not ran.exists()


def test_init_head_starts_from_that_heads_weights_and_vocabulary(distilled, tiny_models, tmp_path):
    options, out = distilled
    frozen = replace(TINY_TRAINING, epochs=0.01, lr=0.0)  # one optimiser step that changes nothing
    again = distill(replace(options, out=tmp_path / "tuned", init_head=out, training=frozen, command="tuned"))
    start, tuned = load_head(out, tiny_models["llama"]), load_head(again, tiny_models["llama"])
    assert torch.equal(tuned.vocab_ids, start.vocab_ids)
    for name, tensor in start.state_dict().items():
        torch.testing.assert_close(tuned.state_dict()[name], tensor)
    card = (again / "README.md").read_text()
    assert f"Training started from the head in `{out}`" in card
    tau = json.loads((again / "quickdraft.json").read_text())["heldout"]["tau"]
    assert f"{tau:.2f} (starting head: {tau:.2f})" in card, (
        "the card compares with the head it started from, unchanged at lr 0"
    )


def test_train_on_prompts_counts_prompt_pairs_in_training_only(distilled):
    options, out = distilled
    answers_train, answers_heldout = examples(out)
    with_prompts_train, with_prompts_heldout = examples(out, train_on_prompts=True)
    assert all(e.first_pair == 0 for e in with_prompts_train)
    assert all(e.first_pair > 0 for e in answers_train)
    assert [e.first_pair for e in with_prompts_heldout] == [e.first_pair for e in answers_heldout]


def test_data_past_the_greedy_pass_samples_every_prompt_again_reproducibly_and_never_holds_it_out(
    tiny_models, prompts_file, tmp_path
):
    """Asking for more tokens than one greedy answer per prompt holds: pass 1 answers the same prompts sampled,
    each answer the one its seed gives the request alone; held-out figures stay on greedy answers, and a held-out
    prompt's sampled answer is trained on nowhere. With resampling off the data stops after the greedy pass."""
    target = tiny_models["llama"]
    prompts = load_training_prompts(prompts_file)
    identity = target_identity(target)
    greedy_only = replace(TINY_GENERATION, resample_temperature=0.0)

    def writer() -> Engine:
        return Engine(target, SpecConfig(drafter="none"), max_batch=TINY_GENERATION.batch_size)

    one_pass = generate_shards(writer, prompts, tmp_path / "greedy", 10**6, greedy_only, identity)
    total = generate_shards(writer, prompts, tmp_path / "more", one_pass + 1, TINY_GENERATION, identity)
    shards = load_shards(tmp_path / "more")
    passes = [entry["pass"] for entry in json.loads((tmp_path / "more" / "manifest.json").read_text())["shards"]]
    assert passes == [0, 0, 0, 1] and [s.answer_pass for s in shards] == passes and total > one_pass
    greedy = {i: tokens[start:].tolist() for s in shards[:3] for i, tokens, start in s.sequences()}
    sampled = {i: tokens[start:].tolist() for i, tokens, start in shards[3].sequences()}
    assert sorted(sampled) == sorted(i for i in greedy if i < TINY_GENERATION.chunk_prompts)
    assert sum(sampled[i] != greedy[i] for i in sampled) > len(sampled) // 2  # temperature 0.7, not greedy
    alone = Engine(target, SpecConfig(drafter="none"))
    for i in list(sampled)[:3]:
        params = TINY_GENERATION.sampling(1, i, len(prompts))
        assert params.temperature == 0.7 and params.seed == len(prompts) + i
        ids = alone.encode(prompts[i], chat=bool(target.tokenizer.chat_template))
        assert list(alone.generate(ids, params).token_ids) == sampled[i]
    held_out_prompts = [i for i in sampled if split_of(i, 0) == "heldout"]
    assert held_out_prompts and all(split_of(i, 1) is None for i in held_out_prompts)
    train_greedy, heldout_greedy = answer_tokens(shards[:3])
    train_all, heldout_all = answer_tokens(shards)
    assert len(heldout_all) == len(heldout_greedy) and len(train_all) == len(train_greedy) + len(sampled) - len(
        held_out_prompts
    )


def test_prompts_that_appear_in_specbench_are_dropped(tmp_path):
    evaluation = ["Compose an engaging travel blog post about a recent trip to Hawaii, highlighting culture.", "Hi"]
    prompts = [
        "compose an engaging  travel blog post about a recent trip to hawaii, highlighting culture.",
        "Please: Compose an engaging travel blog post about a recent trip to Hawaii, highlighting culture. Thanks",
        "hi",
        "Hi there",
        "Write a poem",
    ]
    assert drop_evaluation_prompts(prompts, evaluation) == ["Hi there", "Write a poem"]
    turns = specbench_turns()
    assert turns, "the Spec-Bench dev file (../shared/data/specbench_dev.jsonl) must be readable"
    path = tmp_path / "p.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": p}) for p in [turns[0], "A prompt of our own"]) + "\n")
    assert load_training_prompts(path) == ["A prompt of our own"]


def test_vocabulary_covers_98_percent_of_heldout_answers_and_forces_eos():
    torch.manual_seed(0)
    zipf = 1.0 / torch.arange(1, 5001).double()
    train = [torch.multinomial(zipf, 20000, replacement=True)]
    heldout = [torch.multinomial(zipf, 5000, replacement=True)]
    train_counts, heldout_counts = count_tokens(train, 5000), count_tokens(heldout, 5000)
    choice = choose_vocab(train_counts, heldout_counts, None, forced=[4999])
    assert choice.heldout_coverage >= 0.98
    assert len(choice.ids) % 1024 == 0 or len(choice.ids) == 5000
    smaller = choose_vocab(train_counts, heldout_counts, len(choice.ids) - 1024, forced=[4999])
    assert smaller.heldout_coverage < 0.98
    assert int(choice.ids[0]) == 4999
    fixed = choose_vocab(train_counts, heldout_counts, 100, forced=[4999])
    assert len(fixed.ids) == 100 and 0 < fixed.heldout_coverage < choice.heldout_coverage


def test_standalone_kind_saves_a_transformers_model_usable_as_assistant(tiny_dirs, tiny_models, prompts_file, tmp_path):
    out = tmp_path / "standalone-run"
    code = main(
        [
            "distill",
            "--target",
            str(tiny_dirs["llama"]),
            "--out",
            str(out),
            "--prompts",
            str(prompts_file),
            "--tokens",
            "150",
            "--max-new-tokens",
            "16",
            "--batch-size",
            "8",
            "--epochs",
            "1",
            "--kind",
            "standalone",
        ]
    )
    assert code == 0
    directory = out / "standalone"
    draft = AutoModelForCausalLM.from_pretrained(directory)
    target = tiny_models["llama"].runner.model
    ids = tiny_models["llama"].tokenizer("the quick brown fox", return_tensors="pt").input_ids
    alone = target.generate(ids, max_new_tokens=12, do_sample=False)
    assisted = target.generate(ids, max_new_tokens=12, do_sample=False, assistant_model=draft)
    assert torch.equal(alone, assisted)
    engine = Engine(tiny_models["llama"], SpecConfig(drafter=str(directory), k=3))
    expected = Engine(tiny_models["llama"], SpecConfig(drafter="none")).generate(
        "the quick brown fox", SamplingParams(max_new_tokens=16)
    )
    assert engine.generate("the quick brown fox", SamplingParams(max_new_tokens=16)).token_ids == expected.token_ids
    assert load_model_dir(directory, runtime="hf").info.vocab_size == 320


def test_distill_table_counts_the_runs_answers_into_a_table_the_target_drafts_with(distilled, tmp_path, capsys):
    options, out = distilled
    path = tmp_path / "table.safetensors"
    assert main(["distill", "table", str(out / "data"), "--out", str(path), "--min-count", "1"]) == 0
    table = load_table(path)
    answer_tokens = sum(shard.answer_tokens for shard in load_shards(out / "data"))
    assert capsys.readouterr().out.strip() == (
        f"{path}: {table.keys.numel()} contexts of 1..3 tokens from {answer_tokens} answer tokens of {options.target}"
    )
    assert table.answer_tokens == answer_tokens and table.vocab_size == 320
    target = load_model(options.target)
    engine = Engine(target, SpecConfig(drafter=f"ngram,corpus:{path}"))
    expected = Engine(target, SpecConfig(drafter="none")).generate(
        "the quick brown fox", SamplingParams(max_new_tokens=16)
    )
    assert engine.generate("the quick brown fox", SamplingParams(max_new_tokens=16)).token_ids == expected.token_ids
    assert main(["distill", "table", str(tmp_path / "nothing"), "--out", str(path)]) == 2
    assert "no training data in" in capsys.readouterr().err
    assert main(["distill", "table", str(out / "data"), "--out", str(path), "--min-count", "0"]) == 2
    assert "--min-count must be >= 1, got 0" in capsys.readouterr().err


def test_table_kind_writes_the_data_then_counts_it_and_trains_nothing(tiny_dirs, tiny_models, prompts_file, tmp_path):
    out = tmp_path / "table-run"
    common = ["--target", str(tiny_dirs["llama"]), "--out", str(out), "--prompts", str(prompts_file)]
    assert main(["distill", *common, "--tokens", "150", "--max-new-tokens", "16", "--kind", "table"]) == 0
    assert sorted(path.name for path in out.iterdir()) == ["data", "table.safetensors"]  # no states, no head
    table = load_table(out / "table.safetensors")
    assert table.answer_tokens == sum(shard.answer_tokens for shard in load_shards(out / "data")) >= 150
    assert main(["distill", "table", str(out / "data"), "--out", str(tmp_path / "again.safetensors")]) == 0
    assert torch.equal(load_table(tmp_path / "again.safetensors").keys, table.keys)
    engine = Engine(tiny_models["llama"], SpecConfig(drafter=f"corpus:{out / 'table.safetensors'}", k=3))
    expected = Engine(tiny_models["llama"], SpecConfig(drafter="none")).generate("the quick", SamplingParams())
    assert engine.generate("the quick", SamplingParams()).token_ids == expected.token_ids


def test_distill_export_writes_each_layout_and_refuses_a_used_directory(distilled, tmp_path, capsys):
    """`quickdraft distill export` names its target from quickdraft.json; the written head loads back."""
    options, out = distilled
    for layout in ("speculators", "eagle3"):
        assert main(["distill", "export", str(out), "--format", layout, "--out", str(tmp_path / layout)]) == 0
        assert capsys.readouterr().out.strip() == str(tmp_path / layout)
        assert (tmp_path / layout / "README.md").read_text() == (out / "README.md").read_text()
        loaded = load_head(tmp_path / layout, load_model(options.target))
        assert loaded.vocab_ids.tolist() == load_head(out, load_model(options.target)).vocab_ids.tolist()
    assert main(["distill", "export", str(out), "--format", "eagle3", "--out", str(tmp_path / "eagle3")]) == 2
    assert "is not empty; choose a new --out" in capsys.readouterr().err
