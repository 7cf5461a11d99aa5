"""A scripted OpenAI-compatible chat server on loopback, for tests of whole episodes.

``ScriptedChatServer(script)`` serves ``POST /v1/chat/completions`` from a thread. Each
request consumes the next script step:

* ``{"message": {...}}``: a 200 answer with this assistant message (see :func:`reply`);
* ``{"status": 503, "body": "..."}``: an HTTP error (optionally ``"headers"``);
* ``{"drop": True}``: close the connection without answering;
* ``{"delay": seconds, ...}``: wait first (combine with any of the above).

When the script runs out it answers ``final`` (a plain "DONE" message by default).
``server.requests`` keeps every request body received.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def tool_call(name: str, arguments: dict | str, call_id: str | None = None) -> dict:
    """An OpenAI ``tool_calls`` entry (``arguments`` given as a string is sent as it is)."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id or f"call_{name}_{abs(hash(args)) % 10**8}", "type": "function",
            "function": {"name": name, "arguments": args}}


def reply(content: str = "", calls: list[dict] | None = None, **extra: Any) -> dict:
    """A script step answering with an assistant message."""
    msg: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        msg["tool_calls"] = calls
    msg.update(extra)
    return {"message": msg}


class ScriptedChatServer:
    def __init__(self, script: list[dict], final: dict | None = None, host: str = "127.0.0.1"):
        self.script = list(script)
        self.final = final or reply("Finished.\nDONE")
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    body = {"raw": raw.decode(errors="replace")}
                with server._lock:
                    server.requests.append(body)
                    step = server.script.pop(0) if server.script else server.final
                if step.get("delay"):
                    time.sleep(step["delay"])
                if step.get("drop"):
                    self.close_connection = True
                    try:
                        self.connection.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                    return
                if "status" in step:
                    data = str(step.get("body", "error")).encode()
                    self.send_response(step["status"])
                    for k, v in (step.get("headers") or {}).items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                msg = step["message"]
                finish = "tool_calls" if msg.get("tool_calls") else step.get("finish_reason", "stop")
                n_prompt = len(json.dumps(body.get("messages", []))) // 4
                n_out = len(json.dumps(msg)) // 4
                data = json.dumps({
                    "id": f"chatcmpl-{len(server.requests)}", "object": "chat.completion",
                    "model": body.get("model", ""),
                    "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
                    "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out,
                              "total_tokens": n_prompt + n_out},
                }).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.base_url = f"http://{host}:{self.port}/v1"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> "ScriptedChatServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
