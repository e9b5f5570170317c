"""aiayn: the Transformer of "Attention Is All You Need" (Vaswani et al., 2017) as a package."""

from aiayn.config import PRESETS, ModelConfig
from aiayn.model import DecoderModel, EncoderModel, Transformer

__version__ = "0.1.0"
__all__ = ["ModelConfig", "PRESETS", "Transformer", "EncoderModel", "DecoderModel", "__version__"]
