"""Container-side reaper of the docker sandbox (standard library only): ends the processes
a command of the agent left behind, and says which scratch file systems are full.

It runs as root in the container (which keeps only ``CAP_KILL`` of root's capabilities) and
touches only processes whose real, effective or saved user id is the agent's. Processes are
told apart by structure, never by what the agent can write: a *spawn* is a process the host
started (``docker exec``: its parent is outside the container, pid 0), its child, and the
session that child leads (``setsid``). A session that no living spawn leads holds strays:
processes that started a session of their own or outlived the spawn that made them.

Config (JSON, argv[1]): ``uid``; ``pidfile`` (holds the leader's pid of the target spawn's
session); ``whole`` (end the target session entirely; else keep its leader and the leader's
child, the agent's persistent shell, and end what its commands left); ``scratch`` (paths
whose file systems are reported when full). Each round stops (SIGSTOP) every process found,
until a round finds no new one, so a fork bomb cannot outrun it; then all are killed.
Prints one JSON line.

Usage: python3 -I -S -c "<this file>" '<json config>'
"""

import json
import os
import signal
import sys
import time


def table(uid):
    """pid -> (ppid, sid) of the living processes of ``uid``."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            with open(f"/proc/{name}/status") as f:
                status = f.read()
        except OSError:
            continue
        ids = []
        for line in status.splitlines():
            if line.startswith("Uid:"):
                ids = line.split()[1:]
                break
        if str(uid) not in ids:
            continue
        rest = stat[stat.rindex(")") + 2:].split()
        if rest[0] in ("Z", "X"):
            continue
        out[int(name)] = (int(rest[1]), int(rest[3]))
    return out


def spawns(procs):
    """(exec'd processes and their children, the sessions they lead)."""
    roots = {p for p, (pp, _) in procs.items() if pp == 0}
    kept = roots | {p for p, (pp, _) in procs.items() if pp in roots}
    leaders = {p for p in kept if procs[p][1] == p}
    return kept, leaders


def strays(procs, target, whole):
    kept, leaders = spawns(procs)
    if not whole:
        kept = kept | {p for p, (pp, _) in procs.items() if pp == target}
    found = set()
    for p, (_, sid) in procs.items():
        if whole and sid == target:
            found.add(p)
        elif p not in kept and (sid == target or sid not in leaders):
            found.add(p)
    return found


def reap(uid, target, whole, timeout=5.0):
    stopped = set()
    for _ in range(1000):  # stop every process found until no new one appears
        new = strays(table(uid), target, whole) - stopped
        if not new:
            break
        for p in new:
            try:
                os.kill(p, signal.SIGSTOP)
            except OSError:
                pass
        stopped |= new
    deadline = time.monotonic() + timeout
    left = set(stopped)
    while left and time.monotonic() < deadline:
        for p in left:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)
        procs = table(uid)
        left = (left & set(procs)) | strays(procs, target, whole)
    return len(stopped), sorted(left)


def full(paths, margin=1 << 20):
    out = []
    for p in paths:
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        if st.f_bavail * st.f_frsize <= margin:
            out.append([p, st.f_blocks * st.f_frsize // (1 << 20)])
    return out


def main():
    cfg = json.loads(sys.argv[1])
    uid = int(cfg["uid"])
    try:
        with open(cfg["pidfile"]) as f:
            target = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        target = -1
    stopped, left = reap(uid, target, bool(cfg.get("whole")))
    procs = table(uid)
    _, leaders = spawns(procs)
    sessions = {}
    for p, (ppid, sid) in procs.items():
        if sid in leaders and sid != target and ppid != 0:  # not the exec'd plumbing
            sessions[sid] = sessions.get(sid, 0) + 1
    print(json.dumps({"stopped": stopped, "left": left, "processes": len(procs),
                      "others": sorted(sessions.values(), reverse=True), "full": full(cfg.get("scratch", []))}))


if __name__ == "__main__":
    main()
