"""Frozen, validated configuration objects.

`SamplingParams` says how tokens are chosen for one request, `SpecConfig` how speculation is done,
`EngineConfig` which models are loaded and how. Each validates itself in `__post_init__` and raises
`UsageError` with a one-line message naming the bad field and the valid range.
"""

from dataclasses import dataclass
from typing import Literal, get_args

from quickdraft.errors import UsageError

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_STEP_TOKENS = 128  # prompt tokens all prefilling requests may feed in one engine step, together (one
# PREFILL_BLOCK; BENCHMARKS.md, "Prefill budget per step": a lower TTFT p50 than 256 at 4, 8 and 16 streams)

Runtime = Literal["auto", "native", "hf"]
DType = Literal["auto", "float32", "bfloat16", "int8", "gguf"]
RUNTIMES: tuple[str, ...] = get_args(Runtime)
DTYPES: tuple[str, ...] = get_args(DType)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise UsageError(message)


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen; applied identically to target and draft distributions."""

    temperature: float = 0.0  # 0 means greedy (argmax); > 0 scales logits before softmax
    top_k: int = 0  # keep only the k most likely tokens; 0 disables
    top_p: float = 1.0  # keep the smallest set of tokens whose mass reaches top_p; 1 disables
    seed: int | None = None  # seeds the request's own torch.Generator; None draws a fresh seed
    max_new_tokens: int = 128  # hard cap on generated tokens
    stop: tuple[str, ...] = ()  # text-level stop strings; the stop text is not returned
    ignore_eos: bool = False  # keep generating past end-of-sequence tokens (benchmarks)

    def __post_init__(self) -> None:
        _require(self.temperature >= 0, f"temperature must be >= 0, got {self.temperature}; use 0 for greedy")
        _require(self.top_k >= 0, f"top_k must be >= 0, got {self.top_k}; use 0 to disable top-k")
        _require(0 < self.top_p <= 1, f"top_p must be in (0, 1], got {self.top_p}; use 1 to disable top-p")
        _require(self.max_new_tokens >= 1, f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        _require(all(isinstance(s, str) and s for s in self.stop), "stop strings must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


K_LIMIT = 64  # largest draft length anyone may ask for


@dataclass(frozen=True)
class SpecConfig:
    """How speculation is done for a request."""

    # "none", "ngram" / "ngram:MIN-MAX" (prompt lookup), "head" / "head:DIR" (draft head), a same-tokenizer
    # draft model (name or path), or several joined by commas (auto only); each kind parses its own options
    drafter: str = "ngram"
    # draft tokens per target forward; "auto": chosen per step (0..k_max) by the controller
    k: int | Literal["auto"] = "auto"
    k_max: int = 8  # auto: most draft tokens the controller may choose

    def __post_init__(self) -> None:
        _require(
            self.k == "auto" or (isinstance(self.k, int) and not isinstance(self.k, bool)),
            f"k must be an integer or 'auto', got {self.k!r}",
        )
        _require(self.adaptive or self.k >= 0, f"k must be >= 0, got {self.k}; use 0 to disable drafting")
        _require(self.adaptive or self.k <= K_LIMIT, f"k must be <= {K_LIMIT}, got {self.k}")
        _require(1 <= self.k_max <= K_LIMIT, f"k_max must be in 1..{K_LIMIT}, got {self.k_max}")
        _require(
            all(self.drafters), f"drafter list {self.drafter!r} has an empty name; use e.g. ngram or ngram,DRAFT_MODEL"
        )
        _require(
            self.adaptive or len(self.drafters) == 1,
            f"several drafters ({self.drafter}) need k='auto'; pass one drafter with a fixed k",
        )

    @property
    def adaptive(self) -> bool:
        """True when the controller chooses k (and the drafter) each step."""
        return self.k == "auto"

    @property
    def drafters(self) -> tuple[str, ...]:
        """The drafter names, in the order given."""
        return drafter_names(self.drafter)


def drafter_names(drafter: str) -> tuple[str, ...]:
    """The names in a `SpecConfig.drafter` setting: several joined by commas."""
    return tuple(name.strip() for name in drafter.split(","))


@dataclass(frozen=True)
class EngineConfig:
    """Which target model is loaded, with which runtime, dtype and device."""

    model: str = DEFAULT_MODEL  # built-in name, local HF directory, .gguf file, or hub id
    runtime: Runtime = "auto"  # "auto" picks the native runner when the architecture has one
    dtype: DType = "auto"  # "auto": the native default (int8 weights) when native, float32 otherwise
    device: str = "cpu"
    threads: int | None = None  # torch intra-op threads; None leaves torch's default

    def __post_init__(self) -> None:
        _require(self.runtime in ("auto", "native", "hf"), f"runtime must be auto, native or hf, got {self.runtime!r}")
        _require(
            self.dtype in DTYPES,
            f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}",
        )
        _require(
            not (self.runtime == "hf" and self.dtype in ("int8", "gguf")),
            f"{self.dtype} weights need the native runtime; use --runtime native or auto",
        )
        _require(self.threads is None or self.threads >= 1, f"threads must be >= 1, got {self.threads}")
