"""quickdraft: lossless speculative decoding.

    from quickdraft import Engine, SamplingParams
    engine = Engine.from_names("smollm2-135m-instruct", drafter="ngram", k=4)
    print(engine.generate("Hello", SamplingParams(max_new_tokens=32), chat=True).text)

Names are imported on first use, so `import quickdraft` (and the CLI's start-up) stays light.
"""

import importlib

_EXPORTS = {
    "Engine": "quickdraft.engine",
    "Finished": "quickdraft.engine",
    "TextDelta": "quickdraft.engine",
    "EngineConfig": "quickdraft.config",
    "SamplingParams": "quickdraft.config",
    "SpecConfig": "quickdraft.config",
    "ModelError": "quickdraft.errors",
    "QuickdraftError": "quickdraft.errors",
    "UsageError": "quickdraft.errors",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'quickdraft' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
