"""aiayn: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a package."""

from aiayn.device import bound_kernel_cache

bound_kernel_cache()  # before any matrix product of this process (a long run's memory, aiayn.device)

from aiayn.config import PRESETS, ModelConfig
from aiayn.model import DecoderModel, EncoderModel, Transformer

__version__ = "0.1.0"
__all__ = ["ModelConfig", "PRESETS", "Transformer", "EncoderModel", "DecoderModel", "__version__"]
