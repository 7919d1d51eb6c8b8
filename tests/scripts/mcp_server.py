"""A small MCP server for the tests, on the official SDK's server API (mcp 2.0).

    python mcp_server.py                      # stdio: multiply, fail, hang, big, die, pid
    python mcp_server.py --http PORT          # the same tools over streamable HTTP on loopback
    python mcp_server.py --malformed KIND     # stdio, one tool whose listing is broken

Every start appends this process's pid to the file named by MCP_TEST_PID_FILE (if set), so a
test can check that a run's server is gone when the run ends.
"""

from __future__ import annotations

import asyncio
import os
import sys

MALFORMED = {
    # a property whose "type" is not a JSON Schema type: check_schema refuses it
    "bad_type": ("lookup", {"type": "object", "properties": {"key": {"type": 5}}}),
    # "required" must be a list of names
    "bad_required": ("lookup", {"type": "object", "properties": {}, "required": "key"}),
    # a name OpenAI does not accept (a space and a slash)
    "bad_name": ("look up/key", {"type": "object", "properties": {}}),
}


def record_pid() -> None:
    if path := os.environ.get("MCP_TEST_PID_FILE"):
        with open(path, "a") as handle:
            handle.write(f"{os.getpid()}\n")


def tools_server():
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("faults")

    @server.tool()
    def multiply(a: int, b: int) -> str:
        """Multiply two whole numbers exactly."""
        return str(a * b)

    @server.tool()
    def fail(reason: str = "boom") -> str:
        """Always raises."""
        raise ValueError(reason)

    @server.tool()
    async def hang() -> str:
        """Never answers."""
        await asyncio.sleep(3600)
        return "too late"

    @server.tool()
    def big(n: int) -> str:
        """n characters of output."""
        return "x" * n

    @server.tool()
    def die() -> str:
        """Ends the server's process in the middle of the call."""
        os._exit(3)

    @server.tool()
    def pid() -> str:
        """This server's process id."""
        return str(os.getpid())

    return server


def malformed_server(kind: str) -> None:
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel.server import Server
    from mcp.server.stdio import stdio_server

    name, schema = MALFORMED[kind]

    async def list_tools(ctx, params):
        return types.ListToolsResult(tools=[types.Tool(name=name, input_schema=schema)])

    async def call_tool(ctx, params):
        return types.CallToolResult(content=[types.TextContent(type="text", text="ok")])

    server = Server("malformed", on_list_tools=list_tools, on_call_tool=call_tool)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)


if __name__ == "__main__":
    record_pid()
    if "--malformed" in sys.argv:
        malformed_server(sys.argv[sys.argv.index("--malformed") + 1])
    elif "--http" in sys.argv:
        port = int(sys.argv[sys.argv.index("--http") + 1])
        tools_server().run("streamable-http", host="127.0.0.1", port=port)
    else:
        tools_server().run("stdio")
