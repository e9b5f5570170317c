"""aiayn: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a package."""

from aiayn.kernel_cache import bound_kernel_cache

bound_kernel_cache()  # before any matrix product of this process (a long run's memory, aiayn.kernel_cache)

from aiayn.config import PRESETS, ModelConfig

__version__ = "0.1.0"
__all__ = ["ModelConfig", "PRESETS", "Transformer", "EncoderModel", "DecoderModel", "__version__"]
_MODELS = ("Transformer", "EncoderModel", "DecoderModel")


def __getattr__(name: str):
    """The models on first use (PEP 562): importing PyTorch takes seconds, which `aiayn --help`
    and a mistyped flag need not wait for."""
    if name in _MODELS:
        from aiayn import model

        return getattr(model, name)
    raise AttributeError(f"module 'aiayn' has no attribute {name!r}")
