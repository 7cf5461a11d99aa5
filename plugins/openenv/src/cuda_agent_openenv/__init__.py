"""cuda-agent as an OpenEnv environment (openenv-core 0.3).

* :class:`CudaOpenEnv` -- the server-side ``Environment`` (reset/step/state) over our episodes;
* :func:`create_app` / :func:`serve` -- OpenEnv's FastAPI server for it;
* :class:`CudaEnvClient` -- the WebSocket client (``CudaEnvClient(url).sync()``);
* :class:`CudaAction` (one model turn), :class:`CudaObservation`, :class:`CudaState`.
"""

from typing import Any

# imported on first use: the plugin's entry point (``.plugin``) loads without openenv-core,
# so a machine without it still starts every other command
_EXPORTS = {
    "CudaEnvClient": ".client", "CudaOpenEnv": ".environment", "CudaAction": ".models",
    "CudaObservation": ".models", "CudaState": ".models", "ToolCallSpec": ".models", "ToolOutput": ".models",
    "create_app": ".server", "serve": ".server",
    "EpisodeFactory": "cuda_agent.sandbox.workspace.episodes", "EpisodeOptions": "cuda_agent.sandbox.workspace.episodes",
}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        mod = _EXPORTS[name]
        return getattr(importlib.import_module(mod, __name__) if mod.startswith(".") else importlib.import_module(mod), name)
    raise AttributeError(name)


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
