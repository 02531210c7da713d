"""Which target a head belongs to, and the check that refuses any other target.

A head predicts one model's hidden states and reuses its embedding and output rows, so it is
useless on any other model. Its config records the target's architecture, sizes and a probe:
a few values of the target's output layer, compared with a tolerance wide enough for float32
versus bfloat16 loading and far too narrow for different weights.
"""

import torch

from quickdraft.drafters.head.model import HeadConfig
from quickdraft.errors import UsageError
from quickdraft.models.loading import LoadedModel

PROBE_ROWS = 16  # output-layer rows sampled, evenly spaced over the vocabulary
PROBE_COLUMNS = 8
PROBE_TOLERANCE = 2e-2  # absolute; bfloat16 rounding of typical weights is ~1e-3


def target_identity(target: LoadedModel) -> dict:
    """JSON-able identity: name, architecture, vocab and hidden sizes, output-layer probe."""
    _, output = target.runner.embedding_matrices()
    return {
        "name": target.info.name,
        "architecture": target.info.architecture,
        "vocab_size": target.info.vocab_size,
        "hidden_size": int(output.shape[1]),
        "probe": [round(v, 5) for v in _probe(output).tolist()],
    }


def check_target(expected: dict, target: LoadedModel, head_dir: str) -> None:
    """Raise UsageError unless `target` is the model the head was trained on."""
    actual = target_identity(target)
    for key in ("architecture", "vocab_size", "hidden_size"):
        if actual[key] != expected[key]:
            _refuse(head_dir, expected, f"{key} {actual[key]} instead of {expected[key]}")
    difference = (torch.tensor(actual["probe"]) - torch.tensor(expected["probe"])).abs().max()
    if difference > PROBE_TOLERANCE:
        _refuse(head_dir, expected, "different weights")


def check_shapes(shapes: HeadConfig, layer_vocab: int | None, target: LoadedModel, head_dir: str) -> None:
    """Raise UsageError unless a head of these shapes can read `target` (a head trained elsewhere carries no
    identity, so its shapes are all there is to check): its width, its states, its vocabulary."""
    embeddings, _ = target.runner.embedding_matrices()
    width, num_layers = int(embeddings.shape[1]), target.config.get_text_config().num_hidden_layers
    problems = []
    if shapes.hidden_size != width or shapes.target_hidden_size != width:
        problems.append(
            f"hidden size {width}, the head reads {shapes.target_hidden_size} and embeds {shapes.hidden_size}"
        )
    if layer_vocab is not None and layer_vocab != target.info.vocab_size:
        problems.append(f"a vocabulary of {target.info.vocab_size}, the head's is {layer_vocab}")
    if any(not 0 <= layer < num_layers for layer in shapes.aux_layers):
        problems.append(f"{num_layers} layers, the head reads states {list(shapes.aux_layers)}")
    if problems:
        raise UsageError(
            f"head {head_dir} does not fit target {target.info.name}: the target has {'; '.join(problems)}; "
            "use a head trained for this target, or train one with quickdraft distill --target MODEL"
        )


def _probe(output: torch.Tensor) -> torch.Tensor:
    rows = torch.linspace(0, output.shape[0] - 1, PROBE_ROWS).long()
    return output[rows, :PROBE_COLUMNS].float().flatten()  # [PROBE_ROWS * PROBE_COLUMNS]


def _refuse(head_dir: str, expected: dict, why: str) -> None:
    raise UsageError(
        f"head {head_dir} was trained for target {expected['name']} ({expected['architecture']}); "
        f"this target has {why}; "
        f"use that target, or train a head for this one with quickdraft distill --target MODEL"
    )
