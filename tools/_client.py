"""Client for the workspace service (standard library only; runs in any python3 >= 3.8).

The service listens on a Unix socket; this module finds it through, in order: the
CUDA_AGENT_SERVICE environment variable, ``.cuda_agent/service.sock`` next to this
script's ``tools/`` folder, and ``.cuda_agent/service.sock`` in the current directory.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import sys

SOCKET_REL = os.path.join(".cuda_agent", "service.sock")
MAX_UNIX_PATH = 107  # sun_path holds 108 bytes, the final NUL included


def candidates():
    env = os.environ.get("CUDA_AGENT_SERVICE")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(os.path.dirname(here), SOCKET_REL)
    yield os.path.join(os.getcwd(), SOCKET_REL)


def find_socket():
    seen = []
    for path in candidates():
        if path in seen:
            continue
        seen.append(path)
        if os.path.exists(path):
            return path, seen
    return None, seen


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        http.client.HTTPConnection.__init__(self, "localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        path = self.unix_path
        if len(path) >= MAX_UNIX_PATH:
            # too long for sun_path: connect relative to its folder
            cwd = os.getcwd()
            os.chdir(os.path.dirname(path))
            try:
                s.connect(os.path.basename(path))
            finally:
                os.chdir(cwd)
        else:
            s.connect(path)
        self.sock = s


def request(method, endpoint, body=None, timeout=3600.0):
    """Send one request; returns the decoded JSON answer. Raises OSError if unreachable."""
    path, tried = find_socket()
    if path is None:
        raise FileNotFoundError("no service socket at " + " or ".join(tried))
    conn = UnixHTTPConnection(path, timeout)
    try:
        data = json.dumps(body or {}).encode()
        headers = {"Content-Type": "application/json", "Content-Length": str(len(data))}
        conn.request(method, endpoint, body=data if method == "POST" else None,
                     headers=headers if method == "POST" else {})
        resp = conn.getresponse()
        raw = resp.read()
    finally:
        conn.close()
    try:
        return json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        return {"ok": False, "exit_code": 2, "text": "ERROR: the service sent an unreadable answer"}


def main(endpoint, argv=None):
    """Entry point of compile.py / verify.py / profile.py. Returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    if any(a in ("-h", "--help") for a in argv):
        print("usage: python tools/%s.py [--json]" % endpoint)
        print("  Sends '%s' for this workspace to the workspace service and prints the result." % endpoint)
        print("  Exit code: 0 success, 1 failure (the text says why), 2 service unreachable.")
        return 0
    as_json = "--json" in argv
    try:
        answer = request("POST", "/" + endpoint, {})
    except (OSError, http.client.HTTPException) as exc:
        print("ERROR: cannot reach the workspace service (%s: %s). It runs outside your shell; "
              "if this persists, the environment is broken, not your code." % (type(exc).__name__, exc))
        if endpoint != "compile":  # a finished run's workspace: no service runs any more
            here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            print("A run that has ended has no service: re-check this folder with `cuda-agent %s %s`."
                  % (endpoint, here))
        return 2
    if as_json:
        print(json.dumps(answer, indent=2))
    else:
        print(answer.get("text", "").rstrip())
    code = answer.get("exit_code")
    if not isinstance(code, int):
        code = 0 if answer.get("ok") else 1
    return code
