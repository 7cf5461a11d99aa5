"""cuda-agent rewards: reward functions and speedup arithmetic. Pure Python, no torch."""

from .functions import MilestoneReward, SpeedupReward
from .speedup import faster, geomean, improvement

__version__ = "0.1.0"
__all__ = ["MilestoneReward", "SpeedupReward", "faster", "geomean", "improvement"]
