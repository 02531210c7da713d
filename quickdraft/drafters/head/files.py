"""A head on disk, in the layouts other engines load, and `quickdraft.json` for what only quickdraft checks.

quickdraft writes every head in the **speculators** layout, the one vLLM loads as an EAGLE-3 speculator:

    config.json        speculators_model_type "eagle3", draft_vocab_size, norm_before_residual,
                       target_hidden_size, eagle_aux_hidden_state_layer_ids, a one-layer Llama
                       transformer_layer_config, speculators_config naming the verifier
    model.safetensors  fc.weight, layers.0.*, norm.weight, lm_head.weight, d2t [draft_vocab] int64
                       (target id = draft id + d2t[draft id]), t2d [target_vocab] bool
    quickdraft.json    the target's identity (`identity.py`) and what training measured
    README.md          the card

`export(..., "eagle3")` writes the original EAGLE-3 layout instead (`LlamaForCausalLMEagle3`: a flat
Llama config with draft_vocab_size, the layer's tensors under `midlayer.`), which SGLang loads and
llama.cpp's converter reads. `load_head` reads either layout, quickdraft's own or one trained
elsewhere (for a Llama-family target): a head with `quickdraft.json` is checked against its target's
weights, a foreign one against the target's shapes. The target's token embedding is never stored.
"""

import json
import shutil
from pathlib import Path
from typing import Literal

import torch
from safetensors.torch import load_file, save_file

from quickdraft.drafters.head.identity import check_shapes, check_target
from quickdraft.drafters.head.model import DraftHead, HeadConfig, default_aux_layers
from quickdraft.errors import UsageError
from quickdraft.models.checkpoint import check_safetensors
from quickdraft.models.loading import LoadedModel

FORMAT = "quickdraft-eagle3/1"
CONFIG = "config.json"
WEIGHTS = "model.safetensors"
LEGACY_WEIGHTS = "pytorch_model.bin"  # the original EAGLE-3 releases
QUICKDRAFT = "quickdraft.json"
CARD = "README.md"
SPECULATORS_VERSION = "0.1.0"
LAYER_PREFIX = {"speculators": "layers.0.", "eagle3": "midlayer."}
UNSUPPORTED_FLAGS = ("norm_before_fc", "fc_norm", "norm_output")  # later EAGLE-3 variants, not built here

Layout = Literal["speculators", "eagle3"]


def build_head(config: HeadConfig, target: LoadedModel, vocab_ids: torch.Tensor) -> DraftHead:
    """A fresh head for `target` over the reduced vocabulary `vocab_ids` [draft_vocab]; its output rows start
    as the target's own for those tokens."""
    embeddings, output = target.runner.embedding_matrices()
    head = DraftHead(config, embeddings, vocab_ids)
    with torch.no_grad():
        head.lm_head.weight.copy_(output[vocab_ids].float())
    return head


def save_head(
    directory: Path,
    head: DraftHead,
    identity: dict,
    *,
    verifier: str,
    dtype: torch.dtype = torch.bfloat16,
    **extra,
) -> None:
    """Write the head in the speculators layout with quickdraft.json (identity and `extra`, e.g. coverage)."""
    write_layout(directory, head, identity["vocab_size"], verifier, "speculators", dtype)
    (Path(directory) / QUICKDRAFT).write_text(json.dumps({"format": FORMAT, "target": identity, **extra}, indent=1))


def export(directory: Path, out: Path, layout: Layout, target: LoadedModel) -> Path:
    """Write the head in `directory` (checked against `target`) to `out` in `layout`, with its quickdraft.json
    and card."""
    head = load_head(directory, target)
    defaults = default_aux_layers(target.config.get_text_config().num_hidden_layers)
    if layout == "eagle3" and head.config.aux_layers != defaults:
        raise UsageError(
            f"the eagle3 layout cannot name aux layers {head.config.aux_layers} (its readers take {defaults}); "
            "export with --format speculators"
        )
    identity = read_identity(directory) or {"vocab_size": target.info.vocab_size}
    verifier = read_config(directory).get("speculators_config", {}).get("verifier", {}).get("name_or_path", "")
    write_layout(out, head, identity["vocab_size"], verifier or target.info.name, layout, torch.bfloat16)
    for name in (QUICKDRAFT, CARD):
        if (Path(directory) / name).exists():
            shutil.copyfile(Path(directory) / name, Path(out) / name)
    return out


def write_layout(
    directory: Path, head: DraftHead, target_vocab: int, verifier: str, layout: Layout, dtype: torch.dtype
) -> None:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {_disk_name(name, layout): t.detach().to(dtype).contiguous() for name, t in head.state_dict().items()}
    ids = head.vocab_ids.cpu()
    tensors["d2t"] = (ids - torch.arange(len(ids))).to(torch.int64)  # [draft_vocab]
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d  # [target_vocab]
    save_file(tensors, str(directory / WEIGHTS))
    config = _speculators_config if layout == "speculators" else _eagle3_config
    (directory / CONFIG).write_text(json.dumps(config(head.config, target_vocab, verifier, dtype), indent=1))


def read_config(directory: Path) -> dict:
    path = Path(directory) / CONFIG
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(
            f"{directory} is not a draft head directory ({path}: {exc}); train one with quickdraft distill"
        ) from exc


def read_identity(directory: Path) -> dict | None:
    """The target identity in quickdraft.json, or None for a head trained elsewhere."""
    path = Path(directory) / QUICKDRAFT
    if not path.exists():
        return None
    try:
        meta = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path} is unreadable ({exc}); copy the head again") from exc
    if meta.get("format") != FORMAT:
        raise UsageError(
            f"{path} has format {meta.get('format')!r}, expected {FORMAT}; retrain the head with this version"
        )
    return meta["target"]


def layout_of(config: dict, directory: Path) -> Layout:
    if config.get("speculators_model_type") == "eagle3":
        return "speculators"
    if "LlamaForCausalLMEagle3" in config.get("architectures", []) or (
        "draft_vocab_size" in config and config.get("num_hidden_layers") == 1
    ):
        return "eagle3"
    raise UsageError(
        f"{directory}/{CONFIG} is neither an EAGLE-3 speculator (speculators_model_type eagle3) nor an "
        "LlamaForCausalLMEagle3 head; pass a head from quickdraft distill, vLLM's speculators or EAGLE-3"
    )


def head_config(config: dict, layout: Layout, target: LoadedModel, directory: Path) -> HeadConfig:
    """The head's shapes from either layout's config; aux layers default to EAGLE-3's for the target."""
    layer = config["transformer_layer_config"] if layout == "speculators" else config
    eagle = config if layout == "speculators" else config.get("eagle_config", {})
    for flag in UNSUPPORTED_FLAGS:
        if eagle.get(flag) or config.get(flag):
            raise UsageError(f"{directory}: the EAGLE-3 variant with {flag} is not supported; use a head without it")
    if layer.get("num_hidden_layers", 1) != 1:
        raise UsageError(f"{directory}: {layer['num_hidden_layers']} draft layers; only one-layer EAGLE-3 heads load")
    num_layers = target.config.get_text_config().num_hidden_layers
    hidden = layer["hidden_size"]
    heads = layer["num_attention_heads"]
    return HeadConfig(
        hidden_size=hidden,
        target_hidden_size=config.get("target_hidden_size") or hidden,
        intermediate_size=layer["intermediate_size"],
        num_heads=heads,
        num_kv_heads=layer.get("num_key_value_heads", heads),
        head_dim=layer.get("head_dim") or hidden // heads,
        rope_theta=float(layer.get("rope_theta", (layer.get("rope_parameters") or {}).get("rope_theta", 10000.0))),
        draft_vocab_size=config.get("draft_vocab_size") or layer["vocab_size"],
        aux_layers=tuple(eagle.get("eagle_aux_hidden_state_layer_ids") or default_aux_layers(num_layers)),
        rms_norm_eps=float(layer.get("rms_norm_eps", 1e-6)),
        norm_before_residual=bool(config.get("norm_before_residual", False)),
    )


def load_head(directory: Path, target: LoadedModel) -> DraftHead:
    """The head in `directory` (either layout) bound to `target`; refused if it was trained for another."""
    directory = Path(directory)
    config = read_config(directory)
    layout = layout_of(config, directory)
    shapes = head_config(config, layout, target, directory)
    identity = read_identity(directory)
    if identity is not None:
        check_target(identity, target, str(directory))
    layer = config["transformer_layer_config"] if layout == "speculators" else config
    check_shapes(shapes, layer.get("vocab_size"), target, str(directory))
    tensors = _read_tensors(directory)
    d2t = tensors.pop("d2t", None)
    tensors.pop("t2d", None)
    tensors.pop("embed_tokens.weight", None)  # EAGLE-3 trains with the target's own embedding, frozen
    vocab_ids = torch.arange(shapes.draft_vocab_size) + (0 if d2t is None else d2t.long())  # [draft_vocab]
    if int(vocab_ids.min()) < 0 or int(vocab_ids.max()) >= target.info.vocab_size:
        raise UsageError(f"{directory}: d2t maps draft tokens outside the target's {target.info.vocab_size} ids")
    embeddings, _ = target.runner.embedding_matrices()
    head = DraftHead(shapes, embeddings, vocab_ids)
    weights = {_model_name(name): tensor.float() for name, tensor in tensors.items()}
    missing, unexpected = head.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise UsageError(
            f"{directory}: the head's tensors do not match its config (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}); copy the head again or export it with quickdraft distill export"
        )
    return head.eval()


def _read_tensors(directory: Path) -> dict[str, torch.Tensor]:
    if (directory / WEIGHTS).exists() or not (directory / LEGACY_WEIGHTS).exists():
        check_safetensors(
            directory / WEIGHTS, "the draft head's", "copy the head again or train one with quickdraft distill"
        )
        return load_file(str(directory / WEIGHTS))
    try:  # tensors only: weights_only never runs code from the file
        return torch.load(directory / LEGACY_WEIGHTS, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UsageError(f"{directory / LEGACY_WEIGHTS} is not a tensor file ({exc}); copy the head again") from exc


def _disk_name(name: str, layout: Layout) -> str:
    return LAYER_PREFIX[layout] + name.removeprefix("layers.0.") if name.startswith("layers.0.") else name


def _model_name(name: str) -> str:
    name = name.removeprefix("model.")
    return "layers.0." + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name


def _layer_config(config: HeadConfig, target_vocab: int, dtype: torch.dtype) -> dict:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": target_vocab,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "max_position_embeddings": 8192,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def _speculators_config(config: HeadConfig, target_vocab: int, verifier: str, dtype: torch.dtype) -> dict:
    return {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "draft_vocab_size": config.draft_vocab_size,
        "norm_before_residual": config.norm_before_residual,
        "target_hidden_size": config.target_hidden_size,
        "eagle_aux_hidden_state_layer_ids": list(config.aux_layers),
        "transformer_layer_config": _layer_config(config, target_vocab, dtype),
        "speculators_config": {
            "algorithm": "eagle3",
            "proposal_methods": [
                {"proposal_type": "greedy", "speculative_tokens": 3, "verifier_accept_k": 1, "accept_tolerance": 0.0}
            ],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier, "architectures": ["LlamaForCausalLM"]},
        },
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def _eagle3_config(config: HeadConfig, target_vocab: int, verifier: str, dtype: torch.dtype) -> dict:
    """The flat config of the original layout. It names no aux layers: its readers take EAGLE-3's defaults
    (SGLang would add one to ids it is given, llama.cpp ignores them), so `export` refuses other layers."""
    return {
        **_layer_config(config, target_vocab, dtype),
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": config.draft_vocab_size,
        "target_hidden_size": config.target_hidden_size,
        "norm_before_residual": config.norm_before_residual,
    }
