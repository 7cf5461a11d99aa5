"""A small HTTP server that speaks the part of vLLM's server API the ``vllm_server`` policy
uses, backed by a transformers model: for machines without vLLM (CPU development, tests).

Endpoints: ``GET /v1/models``, ``GET /health``, ``POST /v1/completions`` (prompt as token
ids; returns ``token_ids`` and the sampled tokens' log-probs as ``token_id:<id>`` tokens),
``POST /collective_rpc`` (only the methods of
:class:`~cuda_agent.core.policies.weight_sync.WeightSyncExtension`) and
``POST /reset_prefix_cache``. One request generates at a time.

    python -m cuda_agent.core.policies.hf_server --model <folder> --port 8000
"""

from __future__ import annotations

import argparse
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .hf import HFPolicy
from .weight_sync import WeightSyncExtension


class _LoadableModel:
    """What a vLLM worker's ``model_runner.model`` offers the extension: parameters and
    ``load_weights`` over ``(name, tensor)`` pairs with Hugging Face names."""

    def __init__(self, hf_model: Any):
        self.hf = hf_model

    def parameters(self):
        return self.hf.parameters()

    def load_weights(self, weights) -> None:
        state = dict(weights)
        missing, unexpected = self.hf.load_state_dict(state, strict=False)
        if unexpected:
            raise ValueError(f"unknown weights: {unexpected[:5]}")
        if hasattr(self.hf, "tie_weights"):
            self.hf.tie_weights()


class _Worker(WeightSyncExtension):
    def __init__(self, hf_model: Any):
        self.model_runner = type("ModelRunner", (), {})()
        self.model_runner.model = _LoadableModel(hf_model)


class HFTokenServer:
    """``serve()`` in a thread; ``url`` is the ``/v1`` base URL clients use."""

    def __init__(self, model: str = "", host: str = "127.0.0.1", port: int = 0, served_name: str = "",
                 policy: HFPolicy | None = None):
        self.policy = policy if policy is not None else HFPolicy(HFPolicy.Options(model=model, max_new_tokens=1 << 20))
        self.served_name = served_name or model or "hf"
        self.worker = _Worker(self.policy.model)
        self.lock = threading.Lock()
        self.stats = {"completions": 0, "weight_loads": 0, "prefix_cache_resets": 0}
        self.httpd = ThreadingHTTPServer((host, port), self._handler())
        self.httpd.daemon_threads = True
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> "HFTokenServer":
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="hf-token-server")
        self.thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> "HFTokenServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()

    # -- requests --------------------------------------------------------------------------

    def complete(self, body: dict) -> tuple[int, dict]:
        prompt = body.get("prompt")
        if not isinstance(prompt, list) or not all(isinstance(i, int) for i in prompt) or not prompt:
            return 400, {"error": {"message": "prompt must be a non-empty list of token ids"}}
        stop = {int(i) for i in body.get("stop_token_ids") or []}
        eos = self.policy.tokenizer.eos_token_id
        if eos is not None and not body.get("ignore_eos"):
            stop.add(int(eos))
        sampling = {"max_tokens": int(body.get("max_tokens") or 16),
                    "temperature": float(body.get("temperature", 1.0) if body.get("temperature") is not None else 1.0),
                    "top_p": float(body.get("top_p", 1.0) if body.get("top_p") is not None else 1.0)}
        with self.lock:
            if body.get("seed") is not None:
                self.policy.generator.manual_seed(int(body["seed"]))
            self.policy.stop_ids = stop
            ids, lps, reason = self.policy.generate(prompt, sampling)
            self.stats["completions"] += 1
        choice: dict[str, Any] = {"index": 0, "text": self.policy.tokenizer.decode(ids), "finish_reason": reason}
        if body.get("return_token_ids"):
            choice["token_ids"] = ids
        if body.get("logprobs") is not None:
            tokens = [f"token_id:{i}" for i in ids] if body.get("return_tokens_as_token_ids") else \
                self.policy.tokenizer.convert_ids_to_tokens(ids)
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": lps}
        usage = {"prompt_tokens": len(prompt), "completion_tokens": len(ids), "total_tokens": len(prompt) + len(ids)}
        return 200, {"object": "text_completion", "model": self.served_name, "choices": [choice], "usage": usage}

    def rpc(self, body: dict) -> tuple[int, dict]:
        method = body.get("method")
        allowed = [m for m in vars(WeightSyncExtension) if not m.startswith("_")]
        if method not in allowed:
            return 400, {"error": {"message": f"method {method!r} is not served; known: {allowed}"}}
        args = body.get("args") or []
        with self.lock:
            result = getattr(self.worker, method)(*args)
            self.stats["weight_loads"] += 1
        return 200, {"results": [result]}

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, payload: dict | None) -> None:
                data = json.dumps(payload).encode() if payload is not None else b""
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": server.served_name, "object": "model"}]})
                elif self.path.rstrip("/") == "/health":
                    self._send(200, None)
                else:
                    self._send(404, {"error": {"message": f"no route {self.path}"}})

            def do_POST(self):
                try:
                    n = int(self.headers.get("Content-Length") or 0)
                    body = json.loads(self.rfile.read(n) or b"{}")
                except (ValueError, json.JSONDecodeError) as exc:
                    self._send(400, {"error": {"message": f"bad JSON: {exc}"}})
                    return
                path = self.path.rstrip("/")
                try:
                    if path == "/v1/completions":
                        self._send(*server.complete(body))
                    elif path == "/collective_rpc":
                        self._send(*server.rpc(body))
                    elif path == "/reset_prefix_cache":
                        server.stats["prefix_cache_resets"] += 1
                        self._send(200, None)
                    else:
                        self._send(404, {"error": {"message": f"no route {self.path}"}})
                except Exception as exc:  # one bad request must not stop the server
                    self._send(500, {"error": {"message": f"{type(exc).__name__}: {exc}"}})

        return Handler


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="a local transformers model folder")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--served-model-name", default="")
    args = ap.parse_args()
    server = HFTokenServer(args.model, args.host, args.port, args.served_model_name)
    print(f"serving {args.model} at {server.url}", flush=True)
    server.httpd.serve_forever()


if __name__ == "__main__":
    main()
