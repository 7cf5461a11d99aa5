"""Sandbox launcher (standard library only): runs as root inside fresh mount, PID and
network namespaces (``unshare``), prepares the file system view, applies the limits,
drops to the agent's user id and executes the command.

Usage: python -I -S _launch.py '<json config>' -- argv...
"""

import ctypes
import json
import os
import resource
import signal
import sys

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_NO_NEW_PRIVS = 38

libc = ctypes.CDLL(None, use_errno=True)


def mount(src, target, fstype, flags, data=None):
    r = libc.mount(src.encode() if src else None, target.encode(), fstype.encode() if fstype else None,
                   ctypes.c_ulong(flags), data.encode() if data else None)
    if r != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} -> {target}: {os.strerror(err)}")


def other_can_enter(path):
    try:
        return bool(os.stat(path).st_mode & 0o001)
    except OSError:
        return False


def under(path, parent):
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def setup_fs(cfg):
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    expose = [(p, rw) for p, rw in cfg["expose"] if os.path.exists(p)]
    # keep a handle on every exposed path before anything is hidden
    fds = {p: os.open(p, os.O_PATH) for p, _ in expose}
    replace = []  # folders replaced by an empty tmpfs: scratch dirs and closed ancestors
    for d, size in cfg["scratch"]:
        if os.path.isdir(d):
            replace.append((d, size))
    for d in cfg.get("hide", []):
        if os.path.isdir(d) and not os.path.islink(d):
            replace.append((d, 1))
    for p, _ in expose:
        parts = p.strip("/").split("/")
        for i in range(1, len(parts)):
            anc = "/" + "/".join(parts[:i])
            if not other_can_enter(anc):
                replace.append((anc, 1))
                break
    done = []
    for d, size in sorted(set(replace), key=lambda x: x[0].count("/")):
        if any(under(d, x) for x in done):
            continue
        mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size}m,mode=1777" if size > 1 else "size=1m,mode=755")
        done.append(d)
    for p, rw in expose:
        if not any(under(p, x) for x in done):
            continue
        if os.path.isdir(f"/proc/self/fd/{fds[p]}"):
            os.makedirs(p, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            open(p, "a").close()
        mount(f"/proc/self/fd/{fds[p]}", p, None, MS_BIND | MS_REC)
        if not rw:
            mount("none", p, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID)
    for fd in fds.values():
        os.close(fd)


def limits(cfg):
    for name, value in cfg["rlimits"].items():
        if value:
            which = getattr(resource, name)
            soft, hard = resource.getrlimit(which)
            if hard != resource.RLIM_INFINITY and value > hard:
                value = hard
            resource.setrlimit(which, (value, value))


def main():
    cfg = json.loads(sys.argv[1])
    argv = sys.argv[sys.argv.index("--") + 1:]
    if cfg.get("mount"):
        setup_fs(cfg)
    if cfg.get("loopback"):
        os.system("ip link set lo up >/dev/null 2>&1")
    limits(cfg)
    uid, gid = cfg.get("uid"), cfg.get("gid")
    if uid is not None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    for sig in ("SIGPIPE", "SIGXFSZ", "SIGXCPU"):  # Python ignores these; the agent's tools must not
        if hasattr(signal, sig):
            signal.signal(getattr(signal, sig), signal.SIG_DFL)
    os.umask(0o007)
    os.chdir(cfg["cwd"])
    try:
        os.execvpe(argv[0], argv, cfg["env"])
    except OSError as exc:
        sys.stderr.write(f"sandbox: cannot run {argv[0]}: {exc.strerror}\n")
        os._exit(127)


if __name__ == "__main__":
    main()
