import functools
from collections.abc import Callable
from pathlib import Path

import pytest

from quickdraft.models.store import local_model_dir


@pytest.fixture(scope="session")
def builtin_model_dir() -> Callable[[str], Path]:
    """Factory: `builtin_model_dir("smollm2-135m-instruct")` is the converted directory of a built-in model,
    fetched and converted on first use (into $QUICKDRAFT_CACHE or ~/.cache/quickdraft). For real_model tests."""
    return functools.cache(lambda name: local_model_dir(name, progress=False))
