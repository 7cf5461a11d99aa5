"""cuda-agent inside TRL's GRPOTrainer (TRL 1.16): our environment, tools and judge's reward.

* :class:`CudaToolEnvFactory` -- ``environment_factory`` for multi-turn rollouts: our agent
  tools as methods, the judge's reward through ``get_reward``.
* :class:`CudaReward` -- a ``reward_funcs`` entry for single-turn completions.
* :func:`task_dataset` -- the prompt dataset (``prompt`` and ``task_id`` columns).

Both take a :class:`cuda_agent.sandbox.workspace.episodes.EpisodeFactory` (tasks, backend, reward,
executor). See the plugin's README for a runnable example.
"""

from cuda_agent.sandbox.workspace.episodes import EpisodeFactory, EpisodeOptions

from .dataset import system_message, task_dataset
from .environment import CudaToolEnv, CudaToolEnvFactory, ToolFailed
from .reward import CudaReward, assistant_turn

__version__ = "0.1.0"

__all__ = [
    "CudaReward",
    "CudaToolEnv",
    "CudaToolEnvFactory",
    "EpisodeFactory",
    "EpisodeOptions",
    "ToolFailed",
    "assistant_turn",
    "system_message",
    "task_dataset",
]
