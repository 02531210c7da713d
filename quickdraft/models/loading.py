"""Loading a model directory into a runner plus its tokenizer.

`load_model(name_or_path)` resolves a built-in name, local directory, GGUF file or hub id to a
local directory of safetensors (see `store.local_model_dir`), then builds the runner: the native
runner when the architecture has one (unless `runtime="hf"`), else the transformers fallback.
"""

from dataclasses import dataclass, replace
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from quickdraft.config import DType, Runtime
from quickdraft.errors import ModelError, UsageError
from quickdraft.models.base import ModelInfo, ModelRunner
from quickdraft.models.checkpoint import check_safetensors, model_info, one_line, read_config

_REFETCH = "fetch or save the model again (a built-in one: quickdraft models fetch --force NAME)"


@dataclass(frozen=True)
class LoadedModel:
    """A runner with the tokenizer and the checkpoint's transformers config that go with it."""

    runner: ModelRunner
    tokenizer: PreTrainedTokenizerBase
    config: PretrainedConfig  # the checkpoint's config.json (text sizes: `config.get_text_config()`)

    @property
    def info(self) -> ModelInfo:
        return self.runner.info


def load_model(name_or_path: str, runtime: Runtime = "auto", dtype: DType = "auto", device: str = "cpu") -> LoadedModel:
    """Resolve a model name or path (fetching and converting built-ins once) and load it."""
    from quickdraft.models.store import local_model_dir

    return load_model_dir(local_model_dir(name_or_path), runtime=runtime, dtype=dtype, device=device, name=name_or_path)


def load_model_dir(
    model_dir: Path, runtime: Runtime = "auto", dtype: DType = "auto", device: str = "cpu", name: str | None = None
) -> LoadedModel:
    """Load a local directory holding config.json, safetensors weights and tokenizer files."""
    model_dir = Path(model_dir)
    name = name or str(model_dir)
    check_device(device)
    config = _load_config(model_dir)
    for weights in sorted(model_dir.glob("*.safetensors")):
        check_safetensors(weights, "the model's", _REFETCH)
    tokenizer = _load_tokenizer(model_dir)
    runner = _build_runner(model_dir, runtime, dtype, device, name, tokenizer)
    return LoadedModel(runner=runner, tokenizer=tokenizer, config=config)


def check_device(device: str) -> None:
    """UsageError when `device` names no torch device, or one torch cannot run on here."""
    try:
        torch_device = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise UsageError(f"--device {device!r} names no device ({one_line(exc)}); use cpu, or cuda for a GPU") from exc
    if torch_device.type == "cpu":
        return
    if torch_device.type != "cuda":
        raise UsageError(f"--device {device}: quickdraft runs on cpu or cuda (cuda:N for GPU N); use one of those")
    if not torch.cuda.is_available():
        raise UsageError(
            f"--device {device}: this torch {torch.__version__} sees no CUDA GPU; use --device cpu, or install a CUDA "
            "build of torch on a machine with a GPU"
        )
    if (torch_device.index or 0) >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: torch sees {torch.cuda.device_count()} CUDA GPU(s), numbered from 0")


def transformers_model(model: LoadedModel) -> PreTrainedModel:
    """The transformers model behind a model loaded with runtime="hf" (distillation runs it directly)."""
    from quickdraft.models.hf_runner import HFRunner

    if not isinstance(model.runner, HFRunner):
        raise UsageError(
            f"{model.info.name} runs on the {type(model.runner).__name__}, but this needs its transformers model; "
            "load it with runtime='hf'"
        )
    return model.runner.model


def _load_config(model_dir: Path) -> PretrainedConfig:
    """config.json as transformers reads it, checked first: a wrong type there is one line naming the file."""
    try:
        return AutoConfig.from_pretrained(model_dir)
    except Exception as exc:  # transformers and its strict dataclasses raise many types here; the cause stays chained
        raise ModelError(
            f"the model's {model_dir / 'config.json'} is not a valid model config ({one_line(exc)}); "
            f"fix it, or {_REFETCH}"
        ) from exc


def _load_tokenizer(model_dir: Path) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load the tokenizer in {model_dir}: {exc}; re-fetch or convert the model") from exc


def _build_runner(
    model_dir: Path, runtime: Runtime, dtype: DType, device: str, name: str, tokenizer: PreTrainedTokenizerBase
) -> ModelRunner:
    """The native runner when the architecture has one (unless runtime="hf"), else transformers.

    dtype "auto" means the native default (`default_native_dtype`: on the CPU the GGUF's own blocks for a model
    converted from one, else int8; float32 on a GPU) on the native runner and float32 on the transformers runner.
    """
    if runtime in ("auto", "native"):
        from quickdraft.models.native import default_native_dtype, native_runner_for
        from quickdraft.models.store import converted_from

        gguf = converted_from(model_dir)
        native_dtype = default_native_dtype(gguf is not None, device) if dtype == "auto" else dtype
        runner = native_runner_for(model_dir, dtype=native_dtype, device=device, gguf=gguf)
        if runner is not None:
            runner.info = replace(runner.info, name=name)
            return runner
        architecture = read_config(model_dir).get("architectures", ["?"])[0]
        if runtime == "native" or dtype in ("int8", "gguf"):
            raise UsageError(
                f"no native runner for architecture {architecture}; use --runtime hf with --dtype float32 or bfloat16"
            )
    return _hf_runner(model_dir, "float32" if dtype == "auto" else dtype, device, name, tokenizer)


def _hf_runner(
    model_dir: Path, dtype: DType, device: str, name: str, tokenizer: PreTrainedTokenizerBase
) -> ModelRunner:
    from quickdraft.models.hf_runner import HFRunner

    try:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), use_safetensors=True)
    except (OSError, ValueError) as exc:
        raise ModelError(f"cannot load model weights from {model_dir}: {exc}") from exc
    model.to(device)
    return HFRunner(model, model_info(model_dir, name, vocab_size=model.config.get_text_config().vocab_size))
