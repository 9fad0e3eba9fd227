"""NeuralDbg: explains why a PyTorch training run fails, in ranked causal hypotheses."""
from .causes import Cause
from .session import NeuralDbg
from .stats import Stat
from .thresholds import Thresholds

__version__ = "0.1.0"
__all__ = ["NeuralDbg", "Thresholds", "Cause", "Stat", "__version__"]
