"""Build jail launcher (standard library only): runs as root, makes fresh mount, PID,
network and IPC namespaces, builds a root file system that holds only what the build may
read (see :mod:`.jail`), applies the limits, becomes the build's user and executes the tool.

Usage: python -I -S _jail_launch.py '<json config>' -- argv...

Exit status 125 with a line starting ``build jail:`` on stderr: the jail could not be made
(nothing of the tool ran).
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
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
JAIL_FAILED = 125

libc = ctypes.CDLL(None, use_errno=True)


class JailError(Exception):
    pass


def _fail(msg):
    sys.stderr.write(f"build jail: {msg}\n")
    sys.stderr.flush()
    os._exit(JAIL_FAILED)


def mount(src, target, fstype, flags, data=None):
    r = libc.mount(src.encode() if src else None, target.encode(), fstype.encode() if fstype else None,
                   ctypes.c_ulong(flags), data.encode() if data else None)
    if r != 0:
        err = ctypes.get_errno()
        raise JailError(f"mount {src} on {target}: {os.strerror(err)}")


def _under(path, parent):
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def _inside(new, path):
    return new + path


def _make_target(new, path, is_dir):
    t = _inside(new, path)
    parent = os.path.dirname(t)
    os.makedirs(parent, mode=0o755, exist_ok=True)
    if is_dir:
        os.makedirs(t, mode=0o755, exist_ok=True)
    elif not os.path.exists(t):
        open(t, "a").close()
    return t


def _bind(new, fd, path, rw, is_dir, keep_dev=False):
    t = _make_target(new, path, is_dir)
    mount(f"/proc/self/fd/{fd}", t, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | (0 if keep_dev else MS_NODEV) | (0 if rw else MS_RDONLY)
    mount("none", t, None, flags)


def setup(cfg):
    new = cfg["root"]
    # handles on everything shown, taken before anything is mounted
    binds = []  # (fd, path, rw, is_dir)
    bound = []
    wanted = []
    for p in cfg["system"]:
        if os.path.islink(p):
            wanted.append(("link", p, os.readlink(p)))
        elif os.path.isdir(p):
            wanted.append(("bind", p, False))
    for p, rw in cfg["binds"]:
        if not os.path.lexists(p):
            continue
        real = os.path.realpath(p)
        for shown in dict.fromkeys([os.path.normpath(p), real]):
            wanted.append(("bind", shown, rw, real))
    fds = {}
    for w in wanted:
        if w[0] != "bind":
            continue
        src = w[3] if len(w) > 3 else w[1]
        if src not in fds:
            try:
                fds[src] = os.open(src, os.O_PATH | os.O_CLOEXEC)
            except OSError as exc:
                raise JailError(f"cannot open {src}: {exc.strerror}") from None
    mount("none", "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=755")
    # the private scratch folders first: what is bound below them (a build under /tmp) stays visible
    for d in ("/tmp", "/var/tmp"):
        t = _inside(new, d)
        os.makedirs(t, mode=0o1777, exist_ok=True)
        mount("tmpfs", t, "tmpfs", MS_NOSUID | MS_NODEV, f"size={int(cfg['scratch_mb'])}m,mode=1777")
    # shorter paths first, so a folder bound whole is not bound again piece by piece
    order = sorted(wanted, key=lambda w: (w[1].count("/"), w[1]))
    for w in order:
        kind, path = w[0], w[1]
        if any(_under(path, b) for b in bound):
            continue
        if kind == "link":
            os.makedirs(os.path.dirname(_inside(new, path)), exist_ok=True)
            os.symlink(w[2], _inside(new, path))
            continue
        rw = w[2]
        src = w[3] if len(w) > 3 else path
        fd = fds[src]
        is_dir = os.path.isdir(f"/proc/self/fd/{fd}")
        _bind(new, fd, path, rw, is_dir)
        bound.append(path)
    # /etc: only what the loader and the tools' links need, and who the build user is
    etc = _inside(new, "/etc")
    os.makedirs(etc, mode=0o755, exist_ok=True)
    for name in cfg["etc"]:
        p = "/etc/" + name
        if os.path.islink(p):
            os.symlink(os.readlink(p), etc + "/" + name)
        elif os.path.isdir(p) or os.path.isfile(p):
            fd = os.open(p, os.O_PATH | os.O_CLOEXEC)
            try:
                _bind(new, fd, p, False, os.path.isdir(p))
            finally:
                os.close(fd)
    uid, gid = cfg["uid"], cfg["gid"]
    with open(etc + "/passwd", "w") as f:
        f.write(f"root:x:0:0:root:/root:/bin/sh\nbuild:x:{uid}:{gid}:build:/tmp:/bin/sh\n")
    with open(etc + "/group", "w") as f:
        f.write(f"root:x:0:\nbuild:x:{gid}:\n")
    # /dev: the harmless devices only
    dev = _inside(new, "/dev")
    os.makedirs(dev, mode=0o755, exist_ok=True)
    mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=1m,mode=755")
    for name in ("null", "zero", "full", "random", "urandom"):
        p = "/dev/" + name
        if os.path.exists(p):
            fd = os.open(p, os.O_PATH | os.O_CLOEXEC)
            try:
                _bind(new, fd, p, True, False, keep_dev=True)
            finally:
                os.close(fd)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        os.symlink(target, dev + "/" + name)
    os.makedirs(dev + "/shm", mode=0o1777, exist_ok=True)
    mount("tmpfs", dev + "/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=1777")
    t = _inside(new, "/proc")
    os.makedirs(t, mode=0o555, exist_ok=True)
    mount("proc", t, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    for fd in fds.values():
        os.close(fd)
    mount("none", new, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chroot(new)
    os.chdir("/")


def limits(cfg):
    for name, value in cfg["rlimits"].items():
        if value:
            which = getattr(resource, name)
            _soft, hard = resource.getrlimit(which)
            if hard != resource.RLIM_INFINITY and value > hard:
                value = hard
            resource.setrlimit(which, (value, value))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def child(cfg, argv):
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    try:
        setup(cfg)
        os.chdir(cfg["cwd"])
    except (JailError, OSError) as exc:
        _fail(str(exc))
    limits(cfg)
    uid, gid = cfg["uid"], cfg["gid"]
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid or os.getegid() != gid or os.getgroups():
        _fail("the build user could not be taken")
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    for sig in ("SIGPIPE", "SIGXFSZ", "SIGXCPU"):
        if hasattr(signal, sig):
            signal.signal(getattr(signal, sig), signal.SIG_DFL)
    os.umask(0o022)
    try:
        os.execve(argv[0], argv, cfg["env"])
    except OSError as exc:
        sys.stderr.write(f"{argv[0]}: cannot run in the build jail: {exc.strerror}\n")
        os._exit(127)


def main():
    cfg = json.loads(sys.argv[1])
    argv = sys.argv[sys.argv.index("--") + 1:]
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWNET
    if libc.unshare(flags) != 0:
        _fail(f"no namespaces: {os.strerror(ctypes.get_errno())}")
    pid = os.fork()
    if pid == 0:
        child(cfg, argv)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: os.kill(pid, signal.SIGKILL))
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main()
