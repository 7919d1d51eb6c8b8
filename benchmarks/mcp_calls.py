"""What an MCP tool costs beside the same tool as a plain function: one `multiply` called through
`art_rlvr.rollouts.tools.call_tool` both ways, in one process, side by side (sequential calls, then
calls 16 at a time), plus the server's one-off costs (the load-time listing, connecting, a
restart after a crash).

The MCP server is docs/examples/mcp/calc_server.py over stdio (a subprocess on the official
SDK); the function is the same two lines in this process.

    uv run python benchmarks/mcp_calls.py --calls 200
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

from art_rlvr.rollouts.tools import call_tool, tool
from art_rlvr.scenarios.environments.mcp_tools import McpServer, McpServerSpec

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "docs" / "examples" / "mcp" / "calc_server.py"
CRASHING = ROOT / "tests" / "scripts" / "mcp_server.py"


def multiply(a: int, b: int) -> str:
    """Multiply two whole numbers exactly."""
    return str(a * b)


def call(i: int, name: str = "multiply") -> SimpleNamespace:
    arguments = f'{{"a": {i}, "b": {i + 1}}}' if name == "multiply" else "{}"
    return SimpleNamespace(id=f"c{i}", function=SimpleNamespace(name=name, arguments=arguments))


async def per_call(tools: dict, calls: int, concurrent: int) -> float:
    """Mean wall seconds per call, `concurrent` at a time."""
    started = time.perf_counter()
    for first in range(0, calls, concurrent):
        batch = range(first, min(calls, first + concurrent))
        results = await asyncio.gather(*(call_tool(tools, call(i)) for i in batch))
        assert all(
            r.ok and r.content == str(i * (i + 1)) for i, r in zip(batch, results, strict=True)
        )
    return (time.perf_counter() - started) / calls


async def main(calls: int, repeats: int) -> None:
    print(
        f"loadavg {Path('/proc/loadavg').read_text().split()[:3]}, python {sys.version.split()[0]}"
    )
    started = time.perf_counter()
    server = McpServer.load(McpServerSpec(command=("python", str(SERVER))))
    loaded = time.perf_counter() - started
    mcp_tools = {t.name: tool(t) for t in server.tools}
    function_tools = {"multiply": tool(multiply)}
    started = time.perf_counter()
    await server.start()
    connected = time.perf_counter() - started
    rows = []
    for concurrent in (1, 16):
        mcp, fn = [], []
        for _ in range(repeats):  # interleaved, so both see the same background load
            mcp.append(await per_call(mcp_tools, calls, concurrent))
            fn.append(await per_call(function_tools, calls, concurrent))
        rows.append((concurrent, statistics.median(mcp), statistics.median(fn)))
    await server.aclose()

    crashing = McpServer.load(McpServerSpec(command=("python", str(CRASHING))))
    crash_tools = {t.name: tool(t, timeout_s=60) for t in crashing.tools}
    async with crashing:
        await call_tool(crash_tools, call(0, "die"))
        started = time.perf_counter()
        after = await call_tool(crash_tools, call(1))
        restart = time.perf_counter() - started
    assert after.ok and crashing.counts["restarts"] == 1

    print(f"load-time listing (start, list, stop): {loaded:.2f} s; connect: {connected:.2f} s")
    print(f"first call after a crash (waits for the restart): {restart:.2f} s")
    print("calls at once | MCP ms/call | function ms/call | MCP / function")
    for concurrent, mcp, fn in rows:
        print(f"{concurrent:13d} | {mcp * 1e3:11.3f} | {fn * 1e3:16.3f} | {mcp / fn:.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.repeats))
