import functools
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from quickdraft.models.loading import load_model_dir
from quickdraft.models.store import local_model_dir
from tests.tiny_models import assert_alive, gemma3_config, llama_config, save_tiny_model

TINY_VOCAB = 320
LONG_CONTEXT = 4096
EXACTNESS_TARGETS = ("llama", "gemma3", "llama-corpus")  # tiny targets whose outputs the exactness tests compare

# The machine's two cores; a shared development machine may ask for fewer to avoid oversubscription.
torch.set_num_threads(int(os.environ.get("QUICKDRAFT_TEST_THREADS", "2")))


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """Saved tiny models: a random Llama target, again with a long context (so a server request can run for
    seconds), an unrelated random 1-layer Llama (a draft that rarely agrees), a random Gemma 3 with a short
    sliding window, and a Llama trained on the corpus (its output copies its context: n-gram drafts accepted)."""
    root = tmp_path_factory.mktemp("tiny")
    return {
        "llama": save_tiny_model(root / "llama", llama_config(TINY_VOCAB), seed=0),
        "llama-long": save_tiny_model(
            root / "llama-long", llama_config(TINY_VOCAB, max_position_embeddings=LONG_CONTEXT), seed=0
        ),
        "llama-other": save_tiny_model(root / "llama-other", llama_config(TINY_VOCAB, num_hidden_layers=1), seed=1),
        "gemma3": save_tiny_model(root / "gemma3", gemma3_config(TINY_VOCAB), seed=2),
        "llama-corpus": save_tiny_model(
            root / "llama-corpus", llama_config(TINY_VOCAB, initializer_range=0.02), seed=3, train_steps=200
        ),
    }


@pytest.fixture(scope="session")
def tiny_models(tiny_dirs):
    """The tiny models loaded with the transformers runner; every target used for exactness is alive."""
    models = {name: load_model_dir(path, runtime="hf", name=name) for name, path in tiny_dirs.items()}
    for name in EXACTNESS_TARGETS:
        assert_alive(models[name])
    return models


@pytest.fixture(scope="session")
def builtin_model_dir() -> Callable[[str], Path]:
    """Factory: `builtin_model_dir("smollm2-135m-instruct")` is the converted directory of a built-in model,
    fetched and converted on first use (into $QUICKDRAFT_CACHE or ~/.cache/quickdraft). For real_model tests."""
    return functools.cache(lambda name: local_model_dir(name, progress=False))
