"""Native runners with a preallocated KV cache for the architectures users run most."""

from pathlib import Path

from quickdraft.models.base import ModelRunner


def native_runner_for(model_dir: Path, dtype: str, device: str) -> ModelRunner | None:
    """The native runner for this model directory, or None when its architecture has none."""
    return None
