"""An MCP server with one tool, on the official SDK (mcp 2.0): docs/mcp.md's example."""

from mcp.server.mcpserver import MCPServer

server = MCPServer("calc")


@server.tool()
def multiply(a: int, b: int) -> str:
    """Multiply two whole numbers exactly."""
    return str(a * b)


if __name__ == "__main__":
    server.run("stdio")
