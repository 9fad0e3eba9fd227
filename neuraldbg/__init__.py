"""NeuralDbg: explains why a PyTorch training run fails, in ranked causal hypotheses."""
from .causes import Cause
from .events import SemanticEvent
from .hypothesis import CausalHypothesis
from .session import NeuralDbg
from .states import ActState, GradState
from .stats import Stat
from .thresholds import Thresholds

__version__ = "0.1.0"
__all__ = ["NeuralDbg", "Thresholds", "Cause", "Stat", "CausalHypothesis", "SemanticEvent", "ActState", "GradState",
           "__version__"]
