"""cuda-agent inside verl (0.9.1): ``CudaAgentLoop``, a verl agent loop registered as ``cuda_agent``.

Importing this package registers the agent loop with verl; select it with
``actor_rollout_ref.rollout.agent.default_agent_loop=cuda_agent`` (or an ``agent_name``
column) and configure the tasks under ``cuda_agent:``. See the plugin's README.
"""

from cuda_agent.sandbox.workspace.episodes import EpisodeFactory, EpisodeOptions

from .agent_loop import AGENT_NAME, CudaAgentLoop, VerlServerPolicy, episodes_from_config, sample_task_id, use_episodes

__version__ = "0.1.0"

__all__ = [
    "AGENT_NAME",
    "CudaAgentLoop",
    "EpisodeFactory",
    "EpisodeOptions",
    "VerlServerPolicy",
    "episodes_from_config",
    "sample_task_id",
    "use_episodes",
]
