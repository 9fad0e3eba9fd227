"""NeuralDbg: explains why a PyTorch training run fails, in ranked causal hypotheses."""
from .causes import Cause
from .events import SemanticEvent
from .health import LayerHealth
from .hypothesis import CausalHypothesis
from .schedule import Throttle
from .session import NeuralDbg
from .states import ActState, GradState
from .stats import Stat
from .thresholds import Thresholds
from .verdict import Verdict
from .view import Layer, TraceView
from .watch import EarlyWarning, Forecast, Trend

__version__ = "0.1.0"
__all__ = ["NeuralDbg", "Thresholds", "Verdict", "Cause", "Stat", "CausalHypothesis", "SemanticEvent", "ActState",
           "GradState", "LayerHealth", "TraceView", "Layer", "Throttle", "EarlyWarning", "Forecast", "Trend",
           "__version__"]
