"""Agent tools (OpenAI function-calling schemas) and the context they run in.

Every tool is an :class:`~cuda_agent.core.interfaces.AgentTool` registered through
``register_agent_tools``; an environment picks the set it offers (tool sets are pluggable).

* ``bash`` (persistent shell, optional background job), ``bash_output``, ``kill_job``
* ``read``, ``write`` (an existing file only after a read), ``edit``, ``multi_edit``
* ``glob``, ``grep``, ``todo``

``tool.call(arguments, ToolContext)`` returns a :class:`~cuda_agent.core.types.ToolResult`
or raises :class:`ToolError` with a message meant for the agent.
"""

from .base import LocalProcess, ToolContext, ToolError, function_schema
from .files import EditTool, MultiEditTool, ReadTool, WriteTool
from .search import GlobTool, GrepTool
from .shell import BashOutputTool, BashTool, KillJobTool
from .todo import TodoTool

ALL_TOOLS = [
    BashTool,
    BashOutputTool,
    KillJobTool,
    ReadTool,
    WriteTool,
    EditTool,
    MultiEditTool,
    GlobTool,
    GrepTool,
    TodoTool,
]

DEFAULT_TOOL_NAMES = [t.name for t in ALL_TOOLS]

__all__ = [
    "ALL_TOOLS",
    "DEFAULT_TOOL_NAMES",
    "BashOutputTool",
    "BashTool",
    "EditTool",
    "GlobTool",
    "GrepTool",
    "KillJobTool",
    "LocalProcess",
    "MultiEditTool",
    "ReadTool",
    "TodoTool",
    "ToolContext",
    "ToolError",
    "WriteTool",
    "function_schema",
]
