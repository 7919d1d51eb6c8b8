"""MCP tool servers as an environment's tools, with the SDK's real client and a real server.

The server is `tests/scripts/mcp_server.py` (mcp 2.0's MCPServer over stdio or streamable
HTTP, and a low-level server whose listing is malformed), started as a subprocess exactly as a
run starts it. The fault table: a server that does not start or lists a bad tool is a load-time
error naming the scenario file and line; a tool that raises, hangs, answers megabytes or gets
bad arguments, and a server that dies mid-episode, each give the episode an error tool message
(counted), the crash a restart; the run closes its server when it ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import mcp_types
import pytest

from art_rlvr.core.outcome import turns
from art_rlvr.core.types import Episode
from art_rlvr.rollouts.loop import run_episode
from art_rlvr.rollouts.rollout import rollout
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.rollouts.tools import call_tool, tool
from art_rlvr.rundir.stored import read_trajectories
from art_rlvr.scenarios.environments.mcp_tools import (
    McpServer,
    McpServerSpec,
    schema_problem,
    servers_of,
)
from art_rlvr.scenarios.scenario import load_scenario
from art_rlvr.scenarios.sources import ScenarioFileError
from art_rlvr.testing import ScriptedServer, Step, scripted_model

SERVER = Path(__file__).parents[1] / "scripts" / "mcp_server.py"
STDIO = (sys.executable, str(SERVER))


def call(name: str, arguments: dict[str, Any] | str, id: str = "call_1") -> Any:
    """A tool call as a model's message carries it (`.id`, `.function.name/.arguments`)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return SimpleNamespace(id=id, function=SimpleNamespace(name=name, arguments=raw))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return (
        Path(f"/proc/{pid}").exists()
        and "Z" not in (Path(f"/proc/{pid}/stat").read_text().split()[2])
    )


def gone_within(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not alive(pid)


@pytest.fixture(scope="module")
async def server():
    """One stdio server for the cases that do not crash it."""
    s = McpServer.load(McpServerSpec(command=STDIO))
    async with s:
        yield s


def test_listed_tools_become_openai_tool_schemas(server: McpServer) -> None:
    assert [t.name for t in server.tools] == ["multiply", "fail", "hang", "big", "die", "pid"]
    definition = tool(server.tools[0]).definition
    assert definition == {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two whole numbers exactly.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }


# (tool, arguments, status, what the model is shown)
CALLS = [
    ("multiply", {"a": 123456, "b": 654321}, "ok", "80779853376"),
    (
        "fail",
        {"reason": "the disk is full"},
        "error",
        "Error executing tool fail: the disk is full",
    ),
    ("multiply", {"a": "six", "b": 7}, "error", "validation error"),  # the server checks types
    ("multiply", "{not json", "invalid_arguments", "are not valid JSON"),
    ("multiply", "[6, 7]", "invalid_arguments", "must be a JSON object"),
    ("divide", {"a": 1}, "unknown_tool", "unknown tool 'divide'; available tools: multiply"),
    ("hang", {}, "timeout", "hang timed out after 1.5 s"),
]


@pytest.mark.parametrize(("name", "arguments", "status", "shown"), CALLS)
async def test_calls_follow_the_function_tool_rules(
    server: McpServer, name: str, arguments: Any, status: str, shown: str
) -> None:
    tools = {t.name: tool(t, timeout_s=1.5) for t in server.tools}
    result = await call_tool(tools, call(name, arguments))
    assert result.status == status
    assert shown in result.content
    if status == "timeout":
        assert 1.5 <= result.seconds < 5
    # whatever happened, the connection still serves the next call
    after = await call_tool(tools, call("multiply", {"a": 6, "b": 7}))
    assert (after.status, after.content) == ("ok", "42")


async def test_huge_output_is_capped(server: McpServer) -> None:
    tools = {t.name: tool(t, max_chars=1000) for t in server.tools}
    result = await call_tool(tools, call("big", {"n": 2_000_000}))
    assert result.status == "ok" and result.truncated
    assert result.content.startswith("x" * 1000)
    assert result.content.endswith("[truncated: 1999000 of 2000000 characters not shown]")


async def test_a_server_that_dies_mid_episode_is_restarted_and_the_call_is_an_error() -> None:
    script = [
        Step.calls(("pid", {})),
        Step.calls(("die", {})),
        Step.calls(("pid", {}), ("multiply", {"a": 2, "b": 3})),
        Step.reply("6"),
    ]
    s = McpServer.load(McpServerSpec(command=STDIO))
    with ScriptedServer(script) as llm:
        async with s:
            t = await run_episode(
                scripted_model(llm),
                Episode(
                    [{"role": "user", "content": "What is 2 * 3?"}],
                    tools=tuple(tool(x, timeout_s=20) for x in s.tools),
                    max_turns=4,
                ),
            )
    tool_texts = [m["content"] for m in t.messages_and_choices if isinstance(m, dict)][1:]
    first_pid, crash, second_pid, product = tool_texts
    assert "die raised McpServerCrashed" in crash
    assert "closed the connection during the call (crash 1 of this run" in crash
    assert "restarted for the next call" in crash
    assert first_pid != second_pid and product == "6"  # a new process answers
    assert t.metrics["tool_calls"] == 4 and t.metrics["tool_errors"] == 1
    assert any("tool die" in line and "McpServerCrashed" in line for line in t.logs)
    assert s.counts == {"calls": 4, "starts": 2, "failed_starts": 0, "crashes": 1, "restarts": 1}
    assert not alive(int(first_pid)) and gone_within(int(second_pid))


async def test_restarts_stop_at_max_restarts() -> None:
    s = McpServer.load(McpServerSpec(command=STDIO, max_restarts=0))
    tools = {t.name: tool(t) for t in s.tools}
    async with s:
        died = await call_tool(tools, call("die", {}))
        after = await call_tool(tools, call("multiply", {"a": 2, "b": 3}))
    assert "it is not restarted again (max_restarts=0)" in died.content
    assert after.status == "error" and "is down (1 crash(es)" in after.content
    assert s.counts["crashes"] == 1 and s.counts["starts"] == 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_server(port: int) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(
        [*STDIO, "--http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return process
        time.sleep(0.1)
    process.kill()
    raise RuntimeError("the HTTP MCP server did not come up")


async def test_a_url_server_that_dies_is_reconnected_once_it_is_back() -> None:
    port = free_port()
    process = http_server(port)
    try:
        s = McpServer.load(McpServerSpec(url=f"http://127.0.0.1:{port}/mcp", max_restarts=5))
        tools = {t.name: tool(t, timeout_s=20) for t in s.tools}
        async with s:
            first = await call_tool(tools, call("multiply", {"a": 6, "b": 7}))
            died = await call_tool(tools, call("die", {}))
            process.wait(timeout=10)
            down = await call_tool(tools, call("multiply", {"a": 6, "b": 7}))
            process = http_server(port)
            back = await call_tool(tools, call("multiply", {"a": 6, "b": 7}))
    finally:
        process.kill()
        process.wait()
    assert (first.status, first.content) == ("ok", "42")
    assert died.status == "error" and "closed the connection during the call" in died.content
    assert down.status == "error" and "did not start" in down.content
    assert (back.status, back.content) == ("ok", "42")
    assert s.counts["crashes"] == 1 and s.counts["failed_starts"] >= 1


SCENARIO = """\
name = "mcp_calc"
system_prompt = "You have a multiply tool. Call it to compute, then reply with only the final number."
user_template = "What is {{a}} * {{b}}? Call multiply, then answer with just the number."

[source]
type = "arith"
ops = ["*"]
mul_max_value = {largest}
splits = {{ train = 20, val = 4, test = 4 }}

[reward]
name = "numeric"
params = {{ answer_field = "answer" }}

[environment]
name = "mcp"
tool_choice = "{tool_choice}"
tool_timeout_s = 20
params = {params}
"""


def toml_inline(params: dict[str, Any]) -> str:
    """A TOML inline table (JSON's strings, numbers and arrays are TOML's too)."""
    values = (toml_inline(v) if isinstance(v, dict) else json.dumps(v) for v in params.values())
    return "{ " + ", ".join(f"{k} = {v}" for k, v in zip(params, values, strict=True)) + " }"


def scenario_file(
    tmp_path: Path, params: dict[str, Any], tool_choice: str = "multiply", largest: int = 999
) -> Path:
    path = tmp_path / "mcp_calc.toml"
    text = SCENARIO.format(params=toml_inline(params), tool_choice=tool_choice, largest=largest)
    path.write_text(text)
    return path


PARAMS_LINE = SCENARIO.splitlines().index("params = {params}") + 1
CHOICE_LINE = SCENARIO.splitlines().index('tool_choice = "{tool_choice}"') + 1
NOTHING_LISTENS = f"http://127.0.0.1:{free_port()}/mcp"

# (params, tool_choice, the error's line, what it says)
LOAD_ERRORS = [
    (
        {"command": ["/nonexistent/mcp-server"]},
        "multiply",
        PARAMS_LINE,
        "did not start: command not found: /nonexistent/mcp-server",
    ),
    (
        {"command": [sys.executable, "-c", "import sys; sys.exit('no config file')"]},
        "multiply",
        PARAMS_LINE,
        "closed the connection before answering (exited, or wrote something other than JSON-RPC to stdout); its stderr ends: no config file",
    ),
    (
        {
            "command": [sys.executable, "-c", "import time; time.sleep(60)"],
            "startup_timeout_s": 1.5,
        },
        "multiply",
        PARAMS_LINE,
        "did not start: it did not answer within 1.5 s",
    ),
    ({"url": NOTHING_LISTENS}, "multiply", PARAMS_LINE, "did not start: ConnectError"),
    (
        {"url": "http://10.1.2.3:8000/mcp"},
        "multiply",
        PARAMS_LINE,
        "must be http(s) on 127.0.0.1 or localhost",
    ),
    (
        {"command": [*STDIO], "url": NOTHING_LISTENS},
        "multiply",
        PARAMS_LINE,
        "exactly one of command, module or url (got command, url)",
    ),
    (
        {"command": [*STDIO, "--malformed", "bad_type"]},
        "lookup",
        PARAMS_LINE,
        "tool 'lookup': its input schema is malformed at properties/key/type",
    ),
    (
        {"command": [*STDIO, "--malformed", "bad_required"]},
        "lookup",
        PARAMS_LINE,
        "tool 'lookup': its input schema is malformed at required",
    ),
    (
        {"command": [*STDIO, "--malformed", "bad_name"]},
        "auto",
        PARAMS_LINE,
        "tool 'look up/key': its name is not 1-64 letters",
    ),
    (
        {"command": [*STDIO], "tools": ["multiply", "divide"]},
        "multiply",
        PARAMS_LINE,
        "has no tool(s) ['divide']",
    ),
    (
        {"command": [*STDIO], "tools": ["pid"]},
        "multiply",
        CHOICE_LINE,
        "tool_choice 'multiply' is not auto, none, required or one of its tools (pid)",
    ),
]


@pytest.mark.parametrize(("params", "tool_choice", "line", "says"), LOAD_ERRORS)
def test_a_server_that_cannot_serve_is_a_load_time_error_at_its_line(
    tmp_path: Path, params: dict[str, Any], tool_choice: str, line: int, says: str
) -> None:
    path = scenario_file(tmp_path, params, tool_choice)
    with pytest.raises(ScenarioFileError) as caught:
        load_scenario(str(path))
    assert str(caught.value).startswith(f"{path}:{line}: ")
    assert says in str(caught.value)


def listed(name: str, schema: Any) -> mcp_types.Tool:
    return mcp_types.Tool.model_construct(name=name, input_schema=schema)


@pytest.mark.parametrize(
    ("name", "schema", "problem"),
    [
        ("add", {"type": "object", "properties": {"a": {"type": "integer"}}}, None),
        ("add", {"type": "object"}, None),
        ("add", {"type": "array"}, "not a JSON Schema object (type 'array'"),
        ("add", {"properties": {}}, "not a JSON Schema object (type None"),
        ("add", ["a"], "not a JSON Schema object (type 'list'"),
        (
            "add",
            {"type": "object", "properties": {"a": {"minimum": "0"}}},
            "malformed at properties/a/minimum",
        ),
        ("a.b", {"type": "object"}, "its name is not 1-64 letters"),
        ("x" * 65, {"type": "object"}, "its name is not 1-64 letters"),
    ],
)
def test_schema_problems(name: str, schema: Any, problem: str | None) -> None:
    found = schema_problem(listed(name, schema))
    assert found == problem if problem is None else problem in (found or "")


def test_an_allow_list_keeps_only_the_named_tools(tmp_path: Path) -> None:
    scenario = load_scenario(
        str(scenario_file(tmp_path, {"command": [*STDIO], "tools": ["multiply"]}))
    )
    assert scenario.environment is not None
    assert [t.name for t in scenario.environment.tools] == ["multiply"]
    assert len(servers_of([scenario.environment, None, scenario.environment])) == 1


async def test_a_scenario_episode_through_rollout_calls_the_server(tmp_path: Path) -> None:
    scenario = load_scenario(str(scenario_file(tmp_path, {"command": [*STDIO], "max_turns": 3})))
    example = scenario.splits["val"][0]
    a, b = example.x["a"], example.x["b"]
    script = [Step.calls(("multiply", {"a": a, "b": b})), Step.reply(str(a * b))]
    (server,) = servers_of([scenario.environment])
    with ScriptedServer(script) as llm:
        t = await rollout(scripted_model(llm), example, sampling=SamplingConfig(temperature=0))
        first = llm.chat_requests[0].body
    await server.aclose()
    assert t.reward == 1.0 and t.metrics["tool_calls"] == 1 and t.metrics["tool_errors"] == 0
    tool_message = next(
        m for m in t.messages_and_choices if isinstance(m, dict) and m["role"] == "tool"
    )
    assert tool_message["content"] == str(a * b)
    assert [x["function"]["name"] for x in first["tools"]] == [t.name for t in server.tools]
    assert first["tool_choice"] == {"type": "function", "function": {"name": "multiply"}}
    assert server.counts["starts"] == 1  # started by the first call (no run around it)


async def test_close_ends_the_server_process_and_a_later_call_reconnects(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    s = McpServer.load(McpServerSpec(command=STDIO, env={"MCP_TEST_PID_FILE": str(pids)}))
    tools = {t.name: tool(t, timeout_s=20) for t in s.tools}
    loaded = int(pids.read_text().split()[0])  # the load-time listing's own process
    assert gone_within(loaded)
    first = (await call_tool(tools, call("pid", {}))).content
    await s.aclose()
    assert gone_within(int(first))
    second = (await call_tool(tools, call("pid", {}))).content
    await s.aclose()
    assert second != first and gone_within(int(second))
    assert pids.read_text().split() == [str(loaded), first, second]


def test_each_event_loop_gets_its_own_connection() -> None:
    """A notebook may run `asyncio.run` twice with one loaded scenario."""
    s = McpServer.load(McpServerSpec(command=STDIO))
    tools = {t.name: tool(t, timeout_s=20) for t in s.tools}

    async def product() -> str:
        try:
            return (await call_tool(tools, call("multiply", {"a": 3, "b": 4}))).content
        finally:
            await s.aclose()

    assert [asyncio.run(product()) for _ in range(2)] == ["12", "12"]
    assert s.counts["starts"] == 2 and s.counts["crashes"] == 0


ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "mcp"


def test_the_docs_example_runs_as_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/mcp.md shows the example's two files verbatim, and the scenario plays as said."""
    page = (ROOT / "docs" / "mcp.md").read_text()
    blocks = re.findall(r"```(python|toml)\n(.*?)```", page, flags=re.S)
    first = {lang: next(body for kind, body in blocks if kind == lang) for lang, _ in blocks}
    assert first["python"] == (EXAMPLE / "calc_server.py").read_text()
    assert first["toml"] == (EXAMPLE / "calc_mcp.toml").read_text()
    monkeypatch.chdir(ROOT)  # the command's relative path starts at the repository's root
    scenario = load_scenario("docs/examples/mcp/calc_mcp.toml")
    example = scenario.splits["val"][0]
    a, b = example.x["a"], example.x["b"]

    async def play() -> Any:
        (server,) = servers_of([scenario.environment])
        with ScriptedServer(
            [Step.calls(("multiply", {"a": a, "b": b})), Step.reply(str(a * b))]
        ) as llm:
            async with server:
                return await rollout(scripted_model(llm), example)

    t = asyncio.run(play())
    assert t.reward == 1.0 and t.metrics["tool_calls"] == 1 and t.metrics["tool_errors"] == 0
    assert f"{a * b}" in [m["content"] for m in t.messages_and_choices if isinstance(m, dict)]


def test_cli_eval_of_an_mcp_scenario_closes_its_server_and_exports_tool_turns(
    tmp_path: Path,
) -> None:
    """`mode=eval` through the CLI's main: the server is started with the run and gone after
    it; the stored episodes (call, tool result, answer) export to a `datasets` folder."""
    from clirun import base_env, cli

    from art_rlvr.export_dataset import main as export_main

    pids = tmp_path / "pids"
    path = scenario_file(tmp_path, {"command": [*STDIO], "env": {"MCP_TEST_PID_FILE": str(pids)}})
    items = load_scenario(str(path)).splits["val"][:1]  # one episode: the script's order is its own
    script = [
        step
        for s in items
        for step in (
            Step.calls(("multiply", {"a": s.x["a"], "b": s.x["b"]})),
            Step.reply(str(s.x["a"] * s.x["b"])),
        )
    ]
    with ScriptedServer(script) as llm:
        done = cli(
            [
                f"scenario={path}", "mode=eval", "policy.model=openai/scripted",
                f"policy.api_base={llm.base_url}", "val_limit=1",
                f"run_dir={tmp_path / 'run'}",
            ],
            base_env(),
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["val_accuracy_after"] == 1.0
    started = [int(p) for p in pids.read_text().split()]
    assert len(started) == 3  # two load-time listings (this test's, the CLI's), the run's
    assert all(gone_within(pid) for pid in started)
    out = tmp_path / "dataset"
    assert export_main([str(tmp_path / "run"), "--out", str(out)]) == 0
    import datasets

    row = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "hf"))["val"][0]
    assert [m["role"] for m in row["completion"]] == ["assistant", "tool", "assistant"]
    call_turn, result, answer = row["completion"]
    assert call_turn["tool_calls"][0]["function"]["name"] == "multiply"
    assert result["content"] == answer["content"] == str(items[0].x["a"] * items[0].x["b"])
    assert row["metrics"]["tool_calls"] == 1.0 and row["correct"]


def embedded_scenario(tmp_path: Path, **extra: Any) -> Path:
    """Two-digit products: the embedded model can copy the tool's result."""
    params = {"command": [*STDIO], "tools": ["multiply"], "max_turns": 2, **extra}
    return scenario_file(tmp_path, params, largest=99)


def served_results(messages: list[Any]) -> list[tuple[dict[str, Any], str]]:
    """(arguments, tool result) of every call in an episode's stored messages."""
    calls = {
        c["id"]: json.loads(c["function"]["arguments"])
        for m in messages
        for c in m.get("tool_calls") or []
    }
    return [(calls[m["tool_call_id"]], m["content"]) for m in messages if m["role"] == "tool"]


@pytest.mark.slow
async def test_the_embedded_model_runs_an_mcp_episode(make_model, tmp_path: Path) -> None:
    """TorchBackend's model makes the (grammar-forced) call, the server answers it, the model
    reads the result and answers: two sampled turns in one trajectory."""
    scenario = load_scenario(str(embedded_scenario(tmp_path)))
    (server,) = servers_of([scenario.environment])
    model = await make_model("mcp")
    async with server:
        t = await rollout(model, scenario.splits["val"][0], sampling=SamplingConfig(max_tokens=48))
    messages = [
        m if isinstance(m, dict) else m.message.model_dump() for m in t.messages_and_choices
    ]
    ((args, result),) = served_results(messages)
    assert result == str(args["a"] * args["b"])  # the server's product of what the model sent
    assert t.metrics["turns"] == 2 and t.metrics["tool_errors"] == 0
    assert t.tools and t.tools[0]["function"]["name"] == "multiply"
    assert server.counts == {
        "calls": 1,
        "starts": 1,
        "failed_starts": 0,
        "crashes": 0,
        "restarts": 0,
    }


@pytest.mark.slow
def test_an_rl_run_on_an_mcp_scenario(tmp_path: Path) -> None:
    """`mode=rl` through the CLI's main with the embedded model: its training batch and its
    evaluations are MCP episodes, and the server is gone when the run ends."""
    from clirun import base_env, cli

    pids = tmp_path / "pids"
    path = embedded_scenario(tmp_path, env={"MCP_TEST_PID_FILE": str(pids)})
    run = tmp_path / "run"
    done = cli(
        [
            f"scenario={path}", "mode=rl", "n_batches=1", "groups_per_batch=1", "group_size=2",
            "max_tokens=48", "val_limit=1", "eval_test=false", f"run_dir={run}",
        ],
        base_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (train,) = [e for e in events if e["event"] == "train"]
    assert train["tool_calls_per_episode"] == 1.0 and train["tool_errors_per_episode"] == 0.0
    assert [e["step"] for e in events if e["event"] == "eval"] == [0, 1]
    files = sorted((run / "trajectories").glob("*.jsonl"))
    assert [f.stem.split("_")[0] for f in files] == ["train", "val", "val"]
    for path in files:
        for row in read_trajectories(path):
            for args, result in served_results(turns(row.to_art())):
                assert result == str(args["a"] * args["b"])
    assert json.loads((run / "summary.json").read_text())["steps"] == 1
    assert all(gone_within(int(pid)) for pid in pids.read_text().split())
