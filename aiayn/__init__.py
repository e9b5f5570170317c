"""aiayn: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a package."""

from aiayn.kernel_cache import bound_kernel_cache

bound_kernel_cache()  # before any matrix product of this process (a long run's memory, aiayn.kernel_cache)

from aiayn.config import PRESETS, DecodeConfig, ModelConfig, TrainConfig

__version__ = "0.1.0"
# Loaded on first use (PEP 562): importing PyTorch takes seconds, which `aiayn --help` and a
# mistyped flag need not wait for.
_LAZY = {"Transformer": "aiayn.model", "EncoderModel": "aiayn.model", "DecoderModel": "aiayn.model",
         "Translator": "aiayn.translate", "score": "aiayn.evaluate"}
__all__ = ["ModelConfig", "TrainConfig", "DecodeConfig", "PRESETS", *_LAZY, "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'aiayn' has no attribute {name!r}")


def __dir__() -> list[str]:  # the lazy names too (found in review: dir(aiayn) left them out)
    return sorted({*globals(), *_LAZY})
