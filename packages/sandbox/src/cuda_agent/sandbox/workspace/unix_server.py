"""HTTP over a Unix socket: how the tool scripts reach the workspace service.

:class:`ServiceSocket` serves a service at a socket path from a background thread (a path
too long for ``sun_path`` is bound through its folder's descriptor, or in the temp folder
with a link from the path); its handler maps GET ``/health`` and ``/history`` and POST
``/compile``, ``/verify``, ``/profile``, ``/evaluate`` (JSON in and out) to the service.
:func:`connect` is the client side.
"""

from __future__ import annotations

import http.server
import json
import os
import socket
import socketserver
import tempfile
import threading
from pathlib import Path
from typing import Any

_MAX_UNIX_PATH = 107  # sun_path is 108 bytes on Linux, the final NUL included
ENDPOINTS = ("compile", "verify", "profile", "evaluate")  # POST; GET: health, history


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False

    def __init__(self, path: str, service: Any):
        self.service = service
        super().__init__(path, _Handler)


class _Handler(http.server.BaseHTTPRequestHandler):
    """One connection; the service answers through ``handle``, ``summary`` and ``history``."""

    server: _UnixHTTPServer
    protocol_version = "HTTP/1.1"

    def address_string(self) -> str:  # Unix sockets have no peer address
        return "unix"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        return

    def _send(self, code: int, payload: dict) -> None:
        body = json.dumps(payload, default=str).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> dict:
        n = int(self.headers.get("Content-Length") or 0)
        if n <= 0:
            return {}
        try:
            data = json.loads(self.rfile.read(n) or b"{}")
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        svc = self.server.service
        path = self.path.split("?")[0].rstrip("/")
        if path == "/health":
            self._send(200, {"ok": True, "workspace": str(svc.root), "backend": svc.backend})
        elif path == "/history":
            self._send(200, {"ok": True, "history": [svc.summary(e) for e in svc.history]})
        else:
            self._send(404, {"ok": False, "text": f"unknown endpoint {path}", "exit_code": 2})

    def do_POST(self) -> None:  # noqa: N802
        svc = self.server.service
        path = self.path.split("?")[0].rstrip("/").lstrip("/")
        body = self._body()
        if path not in ENDPOINTS:
            self._send(404, {"ok": False, "text": f"unknown endpoint /{path}", "exit_code": 2})
            return
        try:
            payload = svc.handle(path, fresh=bool(body.get("fresh")))
            self._send(200, payload)
        except Exception as exc:  # a bug must reach the agent as one line, not a dead socket
            svc.log_error(exc)
            self._send(500, {"ok": False, "exit_code": 2,
                             "text": f"ERROR: the workspace service failed: {type(exc).__name__}: {exc}"})


class ServiceSocket:
    """``service`` served at ``path`` (any earlier file there is replaced) until :meth:`close`."""

    def __init__(self, path: str | Path, service: Any, thread_name: str = "service"):
        self.path = str(path)
        if os.path.lexists(self.path):
            os.unlink(self.path)
        bind_path = self.path
        dir_fd = None
        if len(self.path) >= _MAX_UNIX_PATH:  # too long for sun_path
            if os.path.isdir("/proc/self/fd"):  # bind through the folder's descriptor: same file, short name
                dir_fd = os.open(os.path.dirname(self.path), os.O_RDONLY)
                bind_path = f"/proc/self/fd/{dir_fd}/{os.path.basename(self.path)}"
            else:  # bind in the temp folder and link from the workspace
                fd, bind_path = tempfile.mkstemp(prefix="cuda-agent-", suffix=".sock")
                os.close(fd)
                os.unlink(bind_path)
        try:
            self._server = _UnixHTTPServer(bind_path, service)
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
        if dir_fd is not None:
            bind_path = self.path
        os.chmod(bind_path, 0o666)
        if bind_path != self.path:
            os.symlink(bind_path, self.path)
        self.bound_path = bind_path  # where the socket file is (path, or the file path links to)
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.2},
                                        name=thread_name, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and remove the socket file (and its link)."""
        self._server.shutdown()
        self._server.server_close()
        remove_socket(self.path, self.bound_path)


def remove_socket(*paths: str | Path) -> None:
    """Remove the socket files (or links) at ``paths`` that exist."""
    for p in {str(p) for p in paths if p}:
        if os.path.lexists(p):
            try:
                os.unlink(p)
            except OSError:
                pass


def connect(socket_path: str | Path, timeout: float = 3600.0) -> socket.socket:
    """A socket connected to a service (handles paths longer than sun_path)."""
    path = str(socket_path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    if len(path) >= _MAX_UNIX_PATH:
        target = os.path.realpath(path)
        if len(target) < _MAX_UNIX_PATH:
            s.connect(target)
        else:
            dir_fd = os.open(os.path.dirname(target), os.O_RDONLY)
            try:
                s.connect(f"/proc/self/fd/{dir_fd}/{os.path.basename(target)}")
            finally:
                os.close(dir_fd)
    else:
        s.connect(path)
    return s
