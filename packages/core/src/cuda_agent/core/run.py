"""A run: its folder, resolved config, plugin versions, JSON log, trackers and lifecycle hooks."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import uuid
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from . import runlog
from .config import to_yaml
from .errors import ConfigError, InfrastructureError
from .interfaces import Tracker
from .plugins import PluginManager, get_plugin_manager, plugin_versions
from .trackers import TrackerHooks


class Run:
    """Context manager around a run folder.

    ``with Run(cfg, command="eval") as run:`` creates ``<output_dir>/<id>/`` (or reopens
    ``run.resume``; ``dir=`` names the folder instead, and then neither key is read), saves ``config.yaml`` and ``plugins.json``, writes ``log.jsonl`` and
    calls the ``on_run_start``/``on_run_end`` hooks. ``earlier_seconds``: the time the
    folder's earlier sessions ran (before a resume), from their log.

    While it runs, the trackers of ``trackers:`` (built in the main process of a distributed
    launch only: ``RANK`` unset or 0; ``trackers=`` gives them instead) receive every
    lifecycle event called on ``run.pm`` (:class:`~cuda_agent.core.trackers.TrackerHooks`)
    and are closed at its end; ``run.trackers`` holds them.

    A new run claims its folder atomically: the first process to create ``config.yaml``
    there owns it; another one started on the same folder stops with a one-line error
    before it writes anything.
    """

    def __init__(self, config: DictConfig, command: str = "run", pm: PluginManager | None = None,
                 trackers: list[Tracker] | None = None, dir: str | Path | None = None):
        self.config = config
        self.command = command
        self.pm = pm or get_plugin_manager()
        self._given_trackers = trackers
        self.trackers: list[Tracker] = []
        resume = config.run.get("resume") if dir is None and "run" in config else None
        if dir is not None:
            self.dir = Path(dir)
            self.id = self.dir.name
            self.resumed = False
            self.earlier_seconds = 0.0
        elif resume:
            self.dir = Path(resume)
            if not (self.dir / "config.yaml").exists():
                raise ConfigError(f"run.resume={resume}: not a run folder (no config.yaml)")
            self.id = self.dir.name
            self.resumed = True
            self.earlier_seconds = session_seconds(self.dir / "log.jsonl")
        else:
            stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
            name = config.run.get("name") or command
            self.id = f"{stamp}-{name}-{uuid.uuid4().hex[:6]}"
            self.dir = Path(config.run.output_dir) / self.id
            self.resumed = False
            self.earlier_seconds = 0.0
        self.status = "ok"
        self._logfile = None
        self.log = runlog.get_logger()

    def __enter__(self) -> "Run":
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.resumed:
            (self.dir / "config.yaml").write_text(to_yaml(self.config))
        else:
            self._claim()
        meta = {
            "command": self.command,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "plugins": plugin_versions(self.pm),
        }
        (self.dir / "plugins.json").write_text(json.dumps(meta, indent=2))
        lg = self.config.get("logging", {})
        runlog.configure(level=lg.get("level", "info"), console=lg.get("console", True))
        self._logfile = runlog.attach_file(self.dir / "log.jsonl")
        runlog.bind(run_id=self.id)
        self.log = runlog.get_logger()
        self.log.info("run.start", command=self.command, dir=str(self.dir), resumed=self.resumed)
        try:
            self.trackers = self._build_trackers()
        except BaseException:  # a tracker that cannot start (a missing package): the run ends here
            self.status = "failed"
            self._end_log()
            raise
        self._hooks_name = f"run-trackers-{self.id}-{id(self)}"
        self.pm.attach(TrackerHooks(self.trackers), self._hooks_name)
        self.pm.hook.on_run_start(run=self)
        return self

    def _build_trackers(self) -> list[Tracker]:
        if self._given_trackers is not None:
            return list(self._given_trackers)
        if os.environ.get("RANK", "0") not in ("", "0"):
            return []  # one rank logs
        specs = OmegaConf.to_container(self.config.trackers, resolve=True) if "trackers" in self.config else None
        return [self.pm.create("tracker", spec, where=f"trackers[{i}]", run_dir=self.dir)
                for i, spec in enumerate(specs or [])]

    def _claim(self) -> None:
        """Create ``config.yaml`` only if no other run has (O_EXCL: one winner, whatever the timing)."""
        path = self.dir / "config.yaml"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            raise ConfigError(f"run folder {self.dir} already holds a run (it has a config.yaml); "
                              "choose another output folder, or resume that run") from None
        with os.fdopen(fd, "w") as f:
            f.write(to_yaml(self.config))

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is KeyboardInterrupt:
            self.status = "interrupted"
        elif exc_type is not None and issubclass(exc_type, InfrastructureError):
            self.status = "infra_error"
        elif exc_type is not None:
            self.status = "failed"
        try:
            self.pm.hook.on_run_end(run=self, status=self.status)
        finally:
            self.pm.detach(getattr(self, "_hooks_name", ""))
            self._end_log()

    def _end_log(self) -> None:
        self.log.info("run.end", status=self.status)
        runlog.unbind("run_id")
        if self._logfile is not None:
            runlog.detach_file(self._logfile)
            self._logfile = None

    def path(self, *parts: str) -> Path:
        return self.dir.joinpath(*parts)

    def container(self) -> Any:
        return OmegaConf.to_container(self.config, resolve=True)


def _timestamp(line: str) -> tuple[str, float] | None:
    try:
        rec = json.loads(line)
        return rec.get("event", ""), _dt.datetime.fromisoformat(rec["timestamp"].replace("Z", "+00:00")).timestamp()
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def session_seconds(log_path: Path) -> float:
    """Seconds run by the sessions recorded in a run's ``log.jsonl``: each session spans from
    its ``run.start`` event to the last event before the next one, so a session that was
    killed counts up to its last log line."""
    if not Path(log_path).is_file():
        return 0.0
    total, start, last = 0.0, None, None
    for line in Path(log_path).read_text(errors="replace").splitlines():
        got = _timestamp(line)
        if got is None:
            continue
        event, ts = got
        if event == "run.start":
            if start is not None and last is not None:
                total += max(0.0, last - start)
            start = ts
        last = ts
    if start is not None and last is not None:
        total += max(0.0, last - start)
    return total
