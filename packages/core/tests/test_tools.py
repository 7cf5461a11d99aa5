"""Agent tools against a real temporary folder and a real bash."""

from __future__ import annotations

import time

import pytest

from cuda_agent.core.tools import (
    BashOutputTool,
    BashTool,
    EditTool,
    GlobTool,
    GrepTool,
    KillJobTool,
    MultiEditTool,
    ReadTool,
    TodoTool,
    ToolContext,
    ToolError,
    WriteTool,
)


@pytest.fixture
def ctx(tmp_path):
    (tmp_path / "model.py").write_text("import torch\n\nclass Model:\n    pass\n")
    (tmp_path / "kernels").mkdir()
    c = ToolContext(tmp_path, protected=["model.py", "tools"])
    yield c
    c.close()


def test_bash_session_persists_state(ctx):
    bash = BashTool()
    assert bash.call({"command": "cd kernels && export FOO=bar"}, ctx).ok
    r = bash.call({"command": "pwd; echo $FOO"}, ctx)
    assert r.content.splitlines() == [str(ctx.workspace / "kernels"), "bar"]


def test_bash_exit_status_stderr_and_syntax_errors(ctx):
    bash = BashTool()
    r = bash.call({"command": "echo out; echo err >&2; false"}, ctx)
    assert not r.ok and "out" in r.content and "err" in r.content and "exit status 1" in r.content
    r = bash.call({"command": "echo 'unterminated"}, ctx)
    assert not r.ok
    assert bash.call({"command": "echo still alive"}, ctx).content == "still alive"


def test_bash_timeout_restarts_shell_and_exit_is_survived(ctx):
    bash = BashTool()
    t0 = time.monotonic()
    r = bash.call({"command": "sleep 30", "timeout": 1}, ctx)
    assert not r.ok and "timed out" in r.content and time.monotonic() - t0 < 10
    assert bash.call({"command": "echo ok"}, ctx).content == "ok"
    r = bash.call({"command": "exit 3"}, ctx)
    assert "shell exited" in r.content
    assert bash.call({"command": "echo back"}, ctx).content == "back"


def test_background_jobs_output_and_kill(ctx):
    bash, out, kill = BashTool(), BashOutputTool(), KillJobTool()
    r = bash.call({"command": "for i in 1 2 3; do echo line$i; sleep 0.2; done", "run_in_background": True}, ctx)
    assert "job1" in r.content
    time.sleep(1.2)
    r = out.call({"job_id": "job1"}, ctx)
    assert "line1" in r.content and "line3" in r.content and "exited with status 0" in r.content
    assert "no new output" in out.call({"job_id": "job1"}, ctx).content
    bash.call({"command": "sleep 100", "run_in_background": True}, ctx)
    assert "running" in out.call({"job_id": "job2"}, ctx).content
    assert "killed" in kill.call({"job_id": "job2"}, ctx).content
    assert "killed" in out.call({"job_id": "job2"}, ctx).content
    with pytest.raises(ToolError):
        out.call({"job_id": "job9"}, ctx)


def test_read_write_edit_rules(ctx):
    read, write, edit, multi = ReadTool(), WriteTool(), EditTool(), MultiEditTool()
    # a new file needs no read
    assert "created" in write.call({"path": "model_new.py", "content": "a = 1\nb = 2\n"}, ctx).content
    (ctx.workspace / "notes.txt").write_text("old\n")
    with pytest.raises(ToolError, match="read notes.txt before"):
        write.call({"path": "notes.txt", "content": "new"}, ctx)
    r = read.call({"path": "notes.txt"}, ctx)
    assert r.content == "1\told"
    assert "overwrote" in write.call({"path": "notes.txt", "content": "new\n"}, ctx).content
    # changed behind the agent's back: read again
    time.sleep(0.01)
    (ctx.workspace / "notes.txt").write_text("changed\n")
    with pytest.raises(ToolError, match="changed since"):
        edit.call({"path": "notes.txt", "old_string": "changed", "new_string": "x"}, ctx)
    read.call({"path": "notes.txt"}, ctx)
    edit.call({"path": "notes.txt", "old_string": "changed", "new_string": "x"}, ctx)
    assert (ctx.workspace / "notes.txt").read_text() == "x\n"
    # protected and outside paths
    read.call({"path": "model.py"}, ctx)
    with pytest.raises(ToolError, match="read-only"):
        write.call({"path": "model.py", "content": ""}, ctx)
    with pytest.raises(ToolError, match="outside"):
        read.call({"path": "../etc/passwd"}, ctx)
    # edit uniqueness, multi-edit atomicity
    (ctx.workspace / "k.cpp").write_text("x x y\n")
    read.call({"path": "k.cpp"}, ctx)
    with pytest.raises(ToolError, match="2 times"):
        edit.call({"path": "k.cpp", "old_string": "x", "new_string": "z"}, ctx)
    with pytest.raises(ToolError, match="edit 2: old_string not found"):
        multi.call({"path": "k.cpp", "edits": [{"old_string": "y", "new_string": "w"},
                                                {"old_string": "nope", "new_string": "q"}]}, ctx)
    assert (ctx.workspace / "k.cpp").read_text() == "x x y\n"
    multi.call({"path": "k.cpp", "edits": [{"old_string": "x", "new_string": "z", "replace_all": True},
                                            {"old_string": "z z", "new_string": "q"}]}, ctx)
    assert (ctx.workspace / "k.cpp").read_text() == "q y\n"


def test_read_offset_limit(ctx):
    (ctx.workspace / "long.txt").write_text("".join(f"l{i}\n" for i in range(1, 101)))
    r = ReadTool().call({"path": "long.txt", "offset": 10, "limit": 3}, ctx)
    lines = r.content.splitlines()
    assert lines[0].split("\t") == ["10", "l10"] and lines[2].endswith("l12")
    assert "88 more lines" in lines[3]


def test_glob_grep_todo(ctx):
    (ctx.workspace / "kernels" / "a.cpp").write_text("void relu() {}\n// TODO fuse\n")
    (ctx.workspace / "kernels" / "b.cu").write_text("__global__ void relu_kernel() {}\n")
    g = GlobTool().call({"pattern": "kernels/*"}, ctx).content.splitlines()
    assert sorted(g) == ["kernels/a.cpp", "kernels/b.cu"]
    r = GrepTool().call({"pattern": r"relu\w*", "glob": "*.cu"}, ctx).content
    assert r == "kernels/b.cu:1:__global__ void relu_kernel() {}"
    r = GrepTool().call({"pattern": "relu", "output_mode": "count"}, ctx).content
    assert set(r.splitlines()) == {"kernels/a.cpp:1", "kernels/b.cu:1"}
    with pytest.raises(ToolError):
        GrepTool().call({"pattern": "("}, ctx)
    todo = TodoTool()
    r = todo.call({"items": [{"content": "write kernel", "status": "completed"},
                             {"content": "profile", "status": "in_progress"}]}, ctx)
    assert r.content.startswith("1/2 done") and "[~] profile" in r.content
    assert "[x] write kernel" in todo.call({}, ctx).content
    with pytest.raises(ToolError):
        todo.call({"items": [{"content": "x", "status": "maybe"}]}, ctx)
