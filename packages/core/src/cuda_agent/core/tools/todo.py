"""The ``todo`` tool: the agent keeps its own task list (replaced as a whole on each call)."""

from __future__ import annotations

from ..interfaces import AgentTool
from .base import ToolContext, ToolError, function_schema, ok

TODO_KEY = "todo.items"
STATUSES = ("pending", "in_progress", "completed")
MARK = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}


def render_todos(items: list[dict]) -> str:
    if not items:
        return "(todo list is empty)"
    return "\n".join(f"{MARK[i['status']]} {i['content']}" for i in items)


class TodoTool(AgentTool):
    name = "todo"
    description = "Keep a todo list: replace it with the given items and show it."

    def schema(self) -> dict:
        return function_schema(
            self.name,
            "Write your todo list (the whole list each time) to plan and track your work. "
            "Each item has content and status (pending, in_progress or completed). "
            "Call with no items to show the current list.",
            {
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "content": {"type": "string"},
                            "status": {"type": "string", "enum": list(STATUSES)},
                        },
                        "required": ["content", "status"],
                    },
                }
            },
            [],
        )

    def call(self, arguments: dict, context: ToolContext):
        items = arguments.get("items")
        if items is None:
            return ok(self.name, render_todos(context.state.get(TODO_KEY, [])))
        if not isinstance(items, list):
            raise ToolError("todo: 'items' must be a list")
        clean = []
        for k, it in enumerate(items, start=1):
            if not isinstance(it, dict) or not isinstance(it.get("content"), str) or not it["content"].strip():
                raise ToolError(f"todo: item {k} needs a non-empty 'content'")
            status = it.get("status", "pending")
            if status not in STATUSES:
                raise ToolError(f"todo: item {k} has status {status!r}; use one of {', '.join(STATUSES)}")
            clean.append({"content": it["content"].strip(), "status": status})
        context.state[TODO_KEY] = clean
        done = sum(1 for i in clean if i["status"] == "completed")
        return ok(self.name, f"{done}/{len(clean)} done\n" + render_todos(clean))
