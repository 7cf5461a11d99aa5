"""The OpenEnv server for our environment: ``create_app(episodes)`` and ``serve(...)``."""

from __future__ import annotations

import itertools
from typing import Any

from cuda_agent.sandbox.workspace.episodes import EpisodeFactory

from .environment import CudaOpenEnv
from .models import CudaAction, CudaObservation


def create_app(episodes: EpisodeFactory, max_concurrent_envs: int = 8) -> Any:
    """A FastAPI app with OpenEnv's routes (``/ws`` sessions, ``/reset``, ``/step``, ``/schema``, ...)."""
    from openenv.core.env_server.http_server import create_fastapi_app

    cursor = itertools.count()
    return create_fastapi_app(lambda: CudaOpenEnv(episodes, cursor), CudaAction, CudaObservation,
                              max_concurrent_envs=max_concurrent_envs)


def serve(episodes: EpisodeFactory, host: str = "127.0.0.1", port: int = 8000, max_concurrent_envs: int = 8) -> None:
    """Serve until interrupted (uvicorn); closes the episodes' executor at the end."""
    import uvicorn

    try:
        uvicorn.run(create_app(episodes, max_concurrent_envs), host=host, port=port, log_level="warning")
    finally:
        episodes.close()
