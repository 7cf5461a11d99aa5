"""The README's commands name files that exist and commands that the CLI has."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
BLOCKS = "\n".join(re.findall(r"```bash\n(.*?)```", README, flags=re.S))


def test_readme_paths_exist():
    paths = set(re.findall(r"\b((?:configs|scripts|docs|tools|skills)/[\w./-]+\.(?:yaml|py|sh|md))", README))
    assert "configs/toy.yaml" in paths  # the pattern finds the paths it should
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"README.md names files that do not exist: {missing}"


def test_readme_commands_exist():
    from cuda_agent.core.cli import _load_plugin_commands, cli

    _load_plugin_commands()
    used = set(re.findall(r"(?:^|&& )cuda-agent ([a-z][\w-]*)", BLOCKS, flags=re.M))
    assert {"demo", "verify", "profile", "train", "eval"} <= used
    unknown = sorted(used - set(cli.commands))
    assert not unknown, f"README.md uses commands the CLI does not have: {unknown}"
