"""A JSON-over-HTTP client with retries, backoff and client-side pacing, shared by the HTTP policies.

A class using it has ``self.options`` with ``timeout``, ``connect_timeout``, ``max_retries``,
``backoff``, ``max_backoff``, ``requests_per_second`` and ``api_key_env``. Every failed
attempt is logged (``policy.retry``, then ``policy.unavailable`` when the retries are spent);
an endpoint that still fails after them raises :class:`PolicyUnavailable`, an
infrastructure error (the episode is not the model's result).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time

import httpx

from .. import runlog
from ..agent.loop import PolicyError
from ..errors import InfrastructureError

RETRY_STATUS = {408, 409, 429, 500, 502, 503, 504}
# answers that say the endpoint is misconfigured (key, URL, model name), not that the request was bad
UNAVAILABLE_STATUS = {401, 403, 404}


class PolicyUnavailable(PolicyError, InfrastructureError):
    """The policy endpoint could not be reached, or kept failing, after the configured retries."""


class RetryingHTTPClient:
    options: object
    _next_slot: float = 0.0
    requests: int = 0
    retries: int = 0

    def _init_http(self) -> None:
        self._next_slot = 0.0
        self._rate_lock = threading.Lock()  # episodes may run in several threads and event loops
        self.requests = 0
        self.retries = 0

    def _headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json"}
        key = os.environ.get(self.options.api_key_env, "") if self.options.api_key_env else ""
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h

    async def _pace(self) -> None:
        rps = self.options.requests_per_second
        if rps <= 0:
            return
        with self._rate_lock:
            now = time.monotonic()
            wait = self._next_slot - now
            self._next_slot = max(now, self._next_slot) + 1.0 / rps
        if wait > 0:
            await asyncio.sleep(wait)

    def _wait(self, attempt: int, response: httpx.Response | None) -> float:
        if response is not None:
            ra = response.headers.get("retry-after")
            if ra:
                try:
                    return min(float(ra), self.options.max_backoff)
                except ValueError:
                    pass
        base = min(self.options.backoff * (2 ** attempt), self.options.max_backoff)
        return base * (0.5 + random.random() / 2)

    async def post_url(self, url: str, body: dict) -> dict:
        """POST ``body`` as JSON; retried on 408/409/429/5xx and transport errors."""
        timeout = httpx.Timeout(self.options.timeout, connect=self.options.connect_timeout)
        last = ""
        for attempt in range(self.options.max_retries + 1):
            await self._pace()
            response = None
            try:
                self.requests += 1
                async with httpx.AsyncClient(timeout=timeout) as client:
                    response = await client.post(url, json=body, headers=self._headers())
                if response.status_code == 200:
                    if not response.content.strip():  # e.g. vLLM's /reset_prefix_cache
                        return {}
                    try:
                        return response.json()
                    except json.JSONDecodeError:
                        last = f"invalid JSON from {url}: {response.text[:200]!r}"
                elif response.status_code in RETRY_STATUS:
                    last = f"HTTP {response.status_code} from {url}: {response.text[:200]}"
                elif response.status_code in UNAVAILABLE_STATUS:
                    msg = f"HTTP {response.status_code} from {url}: {response.text[:300]}"
                    runlog.get_logger().error("policy.unavailable", url=url, attempts=attempt + 1, error=msg)
                    raise PolicyUnavailable(msg)
                else:
                    raise PolicyError(f"HTTP {response.status_code} from {url}: {response.text[:300]}")
            except httpx.TransportError as exc:  # connect/read errors, dropped connections, timeouts
                last = f"{type(exc).__name__} talking to {url}: {exc}"
            attempts = self.options.max_retries + 1
            if attempt < self.options.max_retries:
                self.retries += 1
                wait = self._wait(attempt, response)
                runlog.get_logger().warning("policy.retry", url=url, attempt=attempt + 1, attempts=attempts,
                                            wait_s=round(wait, 3), error=last)
                await asyncio.sleep(wait)
        runlog.get_logger().error("policy.unavailable", url=url, attempts=attempts, error=last)
        raise PolicyUnavailable(f"{last} (gave up after {attempts} attempts)")

