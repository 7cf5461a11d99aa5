"""Trainer algorithms, registered as ``algorithm`` plugins."""

from .base import TrainAlgorithm
from .grpo import GRPO
from .ppo import PPO
from .rft import RFT, has_loop, has_malformed_call
from .value import ValuePretrain

ALGORITHMS = [PPO, GRPO, RFT, ValuePretrain]

__all__ = ["ALGORITHMS", "GRPO", "PPO", "RFT", "TrainAlgorithm", "ValuePretrain", "has_loop", "has_malformed_call"]
