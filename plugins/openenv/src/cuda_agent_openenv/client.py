"""``CudaEnvClient``: OpenEnv's WebSocket client for our environment (``.sync()`` for plain code)."""

from __future__ import annotations

from typing import Any

from openenv.core.client_types import StepResult
from openenv.core.env_client import EnvClient

from .models import CudaAction, CudaObservation, CudaState


class CudaEnvClient(EnvClient[CudaAction, CudaObservation, CudaState]):
    def _step_payload(self, action: CudaAction) -> dict[str, Any]:
        return action.model_dump(exclude={"metadata"})

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[CudaObservation]:
        obs = CudaObservation(**payload.get("observation", {}), reward=payload.get("reward"),
                              done=bool(payload.get("done", False)))
        return StepResult(observation=obs, reward=payload.get("reward"), done=bool(payload.get("done", False)))

    def _parse_state(self, payload: dict[str, Any]) -> CudaState:
        return CudaState(**payload)
