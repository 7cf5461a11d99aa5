"""The host-side file tools against an agent that plants links: nothing outside the
workspace is read, listed or written, and each refusal names the link and the rule."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from cuda_agent.core.safefs import Tree, UnsafePath
from cuda_agent.core.tools import EditTool, GlobTool, GrepTool, ReadTool, ToolContext, ToolError, WriteTool

CANARY = "TOP-SECRET-CANARY-7"


@pytest.fixture
def outside(tmp_path):
    """A folder next to the workspace holding a secret the agent may not read."""
    d = tmp_path / "outside"
    d.mkdir()
    (d / "secret.txt").write_text(CANARY + "\n")
    (d / "secret.txt").chmod(0o600)
    return d


@pytest.fixture
def ctx(tmp_path):
    ws = tmp_path / "ws"
    (ws / "kernels").mkdir(parents=True)
    (ws / "model.py").write_text("class Model: pass\n")
    c = ToolContext(ws, protected=["model.py"])
    yield c
    c.close()


def test_reading_through_a_link_is_refused_with_the_rule(ctx, outside):
    os.symlink(outside / "secret.txt", ctx.workspace / "model_new.py")
    os.symlink(outside, ctx.workspace / "kernels" / "sub")
    with pytest.raises(ToolError) as e:
        ReadTool().call({"path": "model_new.py"}, ctx)
    msg = str(e.value)
    assert "model_new.py is a symbolic link to" in msg and "outside the workspace" in msg
    assert "never follow symbolic links" in msg and CANARY not in msg
    with pytest.raises(ToolError, match="kernels/sub is a symbolic link to .*outside the workspace"):
        ReadTool().call({"path": "kernels/sub/secret.txt"}, ctx)
    with pytest.raises(ToolError, match="outside the workspace"):
        ReadTool().call({"path": str(outside / "secret.txt")}, ctx)


def test_a_link_inside_the_workspace_is_not_followed_either(ctx):
    (ctx.workspace / "kernels" / "a.cpp").write_text("int a;\n")
    os.symlink("a.cpp", ctx.workspace / "kernels" / "b.cpp")
    with pytest.raises(ToolError, match=r"kernels/b.cpp is a symbolic link \(to a.cpp\).*Use the path it points to"):
        ReadTool().call({"path": "kernels/b.cpp"}, ctx)


def test_grep_never_searches_through_links(ctx, outside):
    (ctx.workspace / "kernels" / "a.cpp").write_text(f"// {CANARY[:10]} in the agent's own file\n")
    os.symlink(outside / "secret.txt", ctx.workspace / "kernels" / "f.txt")
    os.symlink(outside, ctx.workspace / "kernels" / "link")
    grep = GrepTool()
    out = grep.call({"pattern": "SECRET"}, ctx).content
    assert CANARY not in out
    assert "kernels/a.cpp:1:" in out  # the agent's own file is still searched
    assert "kernels/f.txt: refused: kernels/f.txt is a symbolic link to" in out and "outside the workspace" in out
    assert "kernels/link: refused" in out
    for path in ("kernels/link", "kernels/f.txt", "kernels/link/secret.txt"):
        with pytest.raises(ToolError, match="symbolic link") as e:
            grep.call({"pattern": "CANARY", "path": path}, ctx)
        assert CANARY not in str(e.value)


def test_glob_stays_inside_the_workspace(ctx, outside):
    (ctx.workspace / "kernels" / "a.cu").write_text("x")
    os.symlink(outside, ctx.workspace / "kernels" / "link")
    glob = GlobTool()
    for pattern in ("../*", "../../../*", "kernels/../../*", "/etc/*", "**/../*"):
        with pytest.raises(ToolError, match="leaves the workspace"):
            glob.call({"pattern": pattern}, ctx)
    for path in ("..", "../..", "/etc", str(outside)):
        with pytest.raises(ToolError, match="outside the workspace"):
            glob.call({"pattern": "*", "path": path}, ctx)
    out = glob.call({"pattern": "**/*"}, ctx).content
    assert "kernels/a.cu" in out and "secret.txt" not in out
    assert "kernels/link: refused: kernels/link is a symbolic link to" in out
    with pytest.raises(ToolError, match="symbolic link"):
        glob.call({"pattern": "*", "path": "kernels/link"}, ctx)


def test_writing_through_a_linked_folder_writes_nothing_outside(ctx, outside):
    os.symlink(outside, ctx.workspace / "kernels" / "sub")
    os.symlink(outside / "new.txt", ctx.workspace / "kernels" / "dangling.cpp")
    write = WriteTool()
    for path in ("kernels/sub/x.cpp", "kernels/sub/deeper/x.cpp", "kernels/dangling.cpp"):
        with pytest.raises(ToolError, match="symbolic link to .*outside the workspace"):
            write.call({"path": path, "content": "pwned"}, ctx)
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == CANARY + "\n"


def test_edit_of_a_file_swapped_for_a_link_after_reading_is_refused(ctx, outside):
    (ctx.workspace / "model_new.py").write_text("a = 1\n")
    ReadTool().call({"path": "model_new.py"}, ctx)
    os.unlink(ctx.workspace / "model_new.py")
    os.symlink(outside / "secret.txt", ctx.workspace / "model_new.py")
    with pytest.raises(ToolError, match="symbolic link"):
        EditTool().call({"path": "model_new.py", "old_string": CANARY, "new_string": "x"}, ctx)
    assert (outside / "secret.txt").read_text() == CANARY + "\n"


def test_hard_links_and_fifos_are_refused(ctx, outside):
    os.link(outside / "secret.txt", ctx.workspace / "kernels" / "h.cpp")
    with pytest.raises(ToolError, match="2 hard links") as e:
        ReadTool().call({"path": "kernels/h.cpp"}, ctx)
    assert CANARY not in str(e.value)
    assert CANARY not in GrepTool().call({"pattern": "CANARY"}, ctx).content
    os.mkfifo(ctx.workspace / "kernels" / "pipe.cpp")
    with pytest.raises(ToolError, match="not a regular file"):  # refused at once, no hang on the FIFO
        ReadTool().call({"path": "kernels/pipe.cpp"}, ctx)


FLIPPER = """
import os, shutil, sys
sub, link, real, outside, want = sys.argv[1:6]
flips = 0
while flips < int(want):
    try:
        os.symlink(outside, link)
        os.rename(sub, real)
        os.rename(link, sub)  # kernels/sub is now a link out of the workspace
        os.unlink(sub)
        os.rename(real, sub)
        flips += 1
    except OSError:  # the write tool made kernels/sub again meanwhile
        for p in (link, real):
            try:
                os.unlink(p) if os.path.islink(p) else shutil.rmtree(p)
            except OSError:
                pass
"""


def test_a_folder_swapped_for_a_link_while_writing_never_writes_outside(ctx, outside):
    """The race: an agent process flips kernels/sub between a folder and a link (300 times)
    while the write tool writes into it; every component is opened without following links."""
    k = ctx.workspace / "kernels"
    (k / "sub").mkdir()
    proc = subprocess.Popen([sys.executable, "-c", FLIPPER, str(k / "sub"), str(k / ".link"), str(k / ".real"),
                             str(outside), "300"])
    refused = written = 0
    try:
        deadline = time.monotonic() + 60
        i = 0
        while proc.poll() is None and time.monotonic() < deadline:
            i += 1
            try:
                WriteTool().call({"path": f"kernels/sub/f{i}.cpp", "content": "x"}, ctx)
                written += 1
            except ToolError:
                refused += 1
    finally:
        if proc.poll() is None:
            proc.kill()
        rc = proc.wait(10)
    assert sorted(os.listdir(outside)) == ["secret.txt"]
    assert rc == 0 and written > 0, (rc, written, refused)


def test_tree_paths_are_lexical_and_bounded(tmp_path):
    tree = Tree(tmp_path)
    assert tree.rel("kernels/../model_new.py") == "model_new.py"
    assert tree.rel(str(tmp_path / "kernels" / "a.cu")) == "kernels/a.cu"
    assert tree.rel(".") == "."
    for bad in ("..", "../x", "kernels/../../x", "/etc/passwd"):
        with pytest.raises(UnsafePath) as e:
            tree.rel(bad)
        assert e.value.outside
    assert tree.points_outside("kernels/a", "../b") is False
    assert tree.points_outside("kernels/a", "../../b") is True
    assert tree.points_outside("kernels/a", str(tmp_path / "b")) is False
    assert tree.points_outside("kernels/a", "/etc/shadow") is True
