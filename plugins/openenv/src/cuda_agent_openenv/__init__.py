"""cuda-agent as an OpenEnv environment (openenv-core 0.3).

* :class:`CudaOpenEnv` -- the server-side ``Environment`` (reset/step/state) over our episodes;
* :func:`create_app` / :func:`serve` -- OpenEnv's FastAPI server for it;
* :class:`CudaEnvClient` -- the WebSocket client (``CudaEnvClient(url).sync()``);
* :class:`CudaAction` (one model turn), :class:`CudaObservation`, :class:`CudaState`.
"""

from cuda_agent.sandbox.episodes import EpisodeFactory, EpisodeOptions

from .client import CudaEnvClient
from .environment import CudaOpenEnv
from .models import CudaAction, CudaObservation, CudaState, ToolCallSpec, ToolOutput
from .server import create_app, serve

__version__ = "0.1.0"

__all__ = [
    "CudaAction",
    "CudaEnvClient",
    "CudaObservation",
    "CudaOpenEnv",
    "CudaState",
    "EpisodeFactory",
    "EpisodeOptions",
    "ToolCallSpec",
    "ToolOutput",
    "create_app",
    "serve",
]
