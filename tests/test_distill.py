"""`quickdraft distill` end to end on a tiny random target, and its parts: prompts, data, vocabulary, training."""

import json
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

from quickdraft.cli import build_parser, main
from quickdraft.commands.distill_cmd import options_from
from quickdraft.config import SamplingParams, SpecConfig
from quickdraft.distill import data as data_module
from quickdraft.distill.data import AnswerConfig, default_writer_dtype, generate_shards, int8_rounded, load_shards
from quickdraft.distill.pipeline import DistillOptions, distill
from quickdraft.distill.prompts import drop_evaluation_prompts, load_training_prompts, specbench_turns
from quickdraft.distill.train import HeadObjective, TrainConfig, Trainer, evaluate, split_examples
from quickdraft.distill.vocab import choose_vocab, count_tokens
from quickdraft.drafters.head.files import build_head, load_head
from quickdraft.drafters.head.identity import target_identity
from quickdraft.drafters.head.model import HeadConfig
from quickdraft.engine import Engine
from quickdraft.errors import UsageError
from quickdraft.models.loading import load_model, load_model_dir

WORDS = (
    "the quick brown fox jumps over lazy dog speculative decoding drafts tokens once upon a time small model fast"
).split()
TINY_GENERATION = AnswerConfig(
    max_new_tokens=24, batch_size=8, chunk_prompts=16, dtype="bfloat16"
)  # a writer loaded apart from the target
TINY_TRAINING = TrainConfig(
    epochs=20, batch_sequences=4, lr=1e-2, warmup_steps=5, unroll=2, ce_weight=1.0, eval_every=1000, eval_k=3
)


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
    assert config["target"]["vocab_size"] == 320
    assert config["vocab"]["size"] == len(config["vocab"]["ids"]) > 0
    assert 1 in config["vocab"]["ids"]  # end of sequence is always draftable
    assert config["engine"]["identical"] is True
    card = (out / "README.md").read_text()
    assert "held-out tau@3" in card and "answer tokens" in card and "```\ntest\n```" in card
    engine = Engine(tiny_models["llama"], SpecConfig(drafter=f"head:{out}", k=3))
    expected = Engine(tiny_models["llama"], SpecConfig(drafter="none")).generate(
        "the quick brown fox", SamplingParams(max_new_tokens=20)
    )
    assert engine.generate("the quick brown fox", SamplingParams(max_new_tokens=20)).token_ids == expected.token_ids


def test_trained_head_beats_an_untrained_one_on_its_training_distribution(distilled, tiny_models):
    options, out = distilled
    target = tiny_models["llama"]
    train, _ = split_examples(load_shards(out / "data"))
    trained = load_head(out, target)
    torch.manual_seed(0)
    untrained = build_head(trained.config, target, trained.vocab_ids)
    trained_metrics = evaluate(trained, train, TINY_TRAINING)
    untrained_metrics = evaluate(untrained, train, TINY_TRAINING)
    assert trained_metrics["loss"] < untrained_metrics["loss"]
    assert trained_metrics["tau"] > untrained_metrics["tau"] + 0.5


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

    identity = target_identity(load_model(options.target, runtime="hf"))
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
    train, heldout = split_examples(load_shards(out / "data"))
    torch.manual_seed(0)
    head = build_head(HeadConfig.like_target(target.config), target, load_head(out, target).vocab_ids)
    return Trainer(HeadObjective(head, config), train, heldout, config, checkpoint)


def test_training_resumes_from_its_checkpoint(distilled, tiny_models, tmp_path):
    config = replace(TINY_TRAINING, epochs=1)
    first = head_trainer(distilled, tiny_models["llama"], tmp_path / "c.safetensors", config)
    first.run()
    second = head_trainer(distilled, tiny_models["llama"], tmp_path / "c.safetensors", replace(config, epochs=2))
    assert second.resume()
    assert second.state.step == first.state.step == first.batches_per_epoch
    torch.testing.assert_close(second.objective.model.fuse.weight, first.objective.model.fuse.weight)
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
        "\n".join(f"{i} " + " ".join(WORDS[(i * 5 + j) % len(WORDS)] for j in range(3)) for i in range(768))
    )
    out, data = tmp_path / "run", tmp_path / "run" / "data"
    command = [sys.executable, "-m", "quickdraft", "distill", "--target", str(tiny_dirs["llama"]), "--out", str(out)]
    command += ["--prompts", str(prompts), "--tokens", "1000000", "--max-new-tokens", "8", "--batch-size", "32"]
    command += ["--epochs", "1", "--eval-prompts", "1", "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while listed_shards(data) < 2 and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    assert process.wait(30) == -signal.SIGKILL, process.stderr.read().decode()
    finished = json.loads((data / "manifest.json").read_text())["shards"]
    assert 2 <= len(finished) < 6, "killed while there were still shards to write"
    kept = {entry["file"]: (data / entry["file"]).read_bytes() for entry in finished}
    next_shard = f"shard-{len(finished):05d}.safetensors"
    (data / f".{next_shard}.partial").write_bytes(kept[finished[0]["file"]][:1000])
    (data / next_shard).write_bytes(kept[finished[0]["file"]][:1000])

    resumed = subprocess.run([*command, "--resume"], env=env, capture_output=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr.decode()
    shards = json.loads((data / "manifest.json").read_text())["shards"]
    assert shards[: len(finished)] == finished and len(shards) == 6  # 768 prompts, 128 per shard
    assert {name: (data / name).read_bytes() for name in kept} == kept
    assert sum(len(shard.lengths) for shard in load_shards(data)) == 768
    assert not list(data.glob("*.partial")) and (out / "head.safetensors").exists()


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
    tau = json.loads((again / "config.json").read_text())["heldout"]["tau"]
    assert f"{tau:.2f} (starting head: {tau:.2f})" in card, (
        "the card compares with the head it started from, unchanged at lr 0"
    )


@pytest.mark.parametrize("name", ["llama", "gemma3"])
def test_int8_rounded_writer_computes_what_the_native_int8_runtime_computes(tiny_dirs, name):
    """Its logits are about as close to the native int8 runtime's as the two runtimes' bfloat16 forms are
    to each other (arithmetic in another order), and far closer than the unrounded model's."""
    tokens = [(7 * i) % 300 + 3 for i in range(40)]

    def native(dtype):
        return load_model_dir(tiny_dirs[name], runtime="native", dtype=dtype).runner.forward(tokens)  # [40, vocab]

    def hf(model):
        with torch.inference_mode():
            return model(torch.tensor([tokens])).logits[0].float()  # [40, vocab]

    plain = load_model_dir(tiny_dirs[name], runtime="hf", dtype="bfloat16").runner.model
    rounded = int8_rounded(load_model_dir(tiny_dirs[name], runtime="hf", dtype="bfloat16").runner.model)
    floor = (hf(plain) - native("bfloat16")).abs().mean()  # the same weights, arithmetic in another order
    # measured: rounded 1.46 (llama) and 1.09 (gemma3) floors, unrounded 2.75 and 1.86 (native float32 attention)
    assert (hf(rounded) - native("int8")).abs().mean() < 1.6 * floor
    assert (hf(plain) - native("int8")).abs().mean() > 1.7 * floor
    torch.testing.assert_close(
        rounded.get_input_embeddings().weight, plain.get_input_embeddings().weight
    )  # only matrices are rounded


def test_gen_dtype_auto_resolves_to_this_cpus_native_dtype_and_the_card_command_names_it(tmp_path):
    native_bfloat16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert default_writer_dtype() == ("bfloat16" if native_bfloat16 else "float32")
    options = options_from(build_parser().parse_args(["distill", "--out", str(tmp_path)]))
    assert options.generation.dtype == default_writer_dtype()
    assert f"--gen-dtype {default_writer_dtype()}" in options.command and "--gen-dtype auto" not in options.command
    chosen = options_from(build_parser().parse_args(["distill", "--out", str(tmp_path), "--gen-dtype", "int8"]))
    assert chosen.generation.dtype == "int8" and "--gen-dtype int8" in chosen.command


def test_train_on_prompts_counts_prompt_pairs_in_training_only(distilled):
    options, out = distilled
    shards = load_shards(out / "data")
    answers_train, answers_heldout = split_examples(shards)
    with_prompts_train, with_prompts_heldout = split_examples(shards, train_on_prompts=True)
    assert all(e.first_pair == 0 for e in with_prompts_train)
    assert all(e.first_pair > 0 for e in answers_train)
    assert [e.first_pair for e in with_prompts_heldout] == [e.first_pair for e in answers_heldout]


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
