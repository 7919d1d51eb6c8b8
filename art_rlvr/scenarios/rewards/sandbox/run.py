"""Run a program and its tests in a sandbox and collect the judge's reports; pick a sandbox."""

from __future__ import annotations

import ast
import asyncio
import concurrent.futures
import contextlib
import marshal
import os
import time
from collections.abc import Callable
from functools import cache
from typing import Literal

from pydantic import BaseModel, ConfigDict

from art_rlvr.scenarios.rewards.sandbox import bwrap, root, watch
from art_rlvr.scenarios.rewards.sandbox.cgroups import (
    HARNESS_MB,
    HARNESS_TASKS,
    Hierarchy,
    RunCgroup,
    cgroup_hierarchy,
    run_name,
)
from art_rlvr.scenarios.rewards.sandbox.spec import SETUP_FAILED, Launch, SandboxKind, SandboxLimits

SandboxChoice = Literal["auto", "root", "bwrap"]
KINDS: dict[SandboxKind, Callable[[SandboxLimits, RunCgroup | None], Launch]] = {
    "root": root.launch,
    "bwrap": bwrap.launch,
}
PRECONDITIONS: dict[SandboxKind, Callable[[], str | None]] = {
    "root": root.precondition,
    "bwrap": bwrap.precondition,
}
JOB_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/tmp/work",
    "TMPDIR": "/tmp/work",
    "LANG": "C.UTF-8",
    "PYTHONHASHSEED": "0",
}
MAX_REPORT_BYTES = 4 * 2**20


class SandboxUnavailable(RuntimeError):
    """No code sandbox can run on this machine (or not the one asked for)."""


class RunResult(BaseModel):
    """What came back from one sandboxed run, before it is turned into a Score."""

    model_config = ConfigDict(frozen=True)

    reports: list[dict[str, object]]
    exit_code: int | None
    timed_out: bool
    output_overflow: bool
    stderr_tail: str  # the solution's output (stdout and stderr), then the harness's stderr
    seconds: float
    oom_kills: int = 0  # processes the kernel killed for the run's memory cgroup
    over_memory_mb: float = 0.0  # without a cgroup: the tree's total when the watch killed it


class Tests(BaseModel):
    """What only the judge reads: the prompt's code (its helpers), the tests, their units."""

    model_config = ConfigDict(frozen=True)

    support: str
    test: str
    units: list[str]
    entry_point: str | None


def make_job(
    launch: Launch,
    program: str,
    entry_point: str | None,
    limits: SandboxLimits,
    fds: tuple[int, int],
) -> dict[str, object]:
    """The launcher's job: everything the solution's process may see (not the tests)."""
    return {
        **launch.job,
        "program": program,
        "entry_point": entry_point,
        "limits": limits.rlimits(),
        "env": JOB_ENV,
        "report_fd": fds[0],
        "tests_fd": fds[1],
    }


async def _drain(stream: asyncio.StreamReader, cap: int, on_overflow) -> tuple[bytes, bool]:
    data = bytearray()
    while chunk := await stream.read(65536):
        if len(data) + len(chunk) > cap:
            data += chunk[: cap - len(data)]
            on_overflow()
            return bytes(data), True
        data += chunk
    return bytes(data), False


async def _discard(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass


async def _reader(fd: int) -> asyncio.StreamReader:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    pipe = open(fd, "rb", 0)  # noqa: SIM115 (the transport closes it)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    return reader


async def _send(fd: int, data: bytes) -> None:
    """Write `data` to a pipe and close it, without blocking the loop (a reader that never
    reads, or dies, only leaves the bytes unsent)."""
    loop = asyncio.get_running_loop()
    pipe = open(fd, "wb", 0)  # noqa: SIM115 (the transport closes it)
    transport, _ = await loop.connect_write_pipe(asyncio.Protocol, pipe)
    transport.write(data)
    transport.close()


def run_cgroup(limits: SandboxLimits) -> RunCgroup | None:
    """A fresh cgroup for one run with its limits, or None where none can be made."""
    hierarchy = cgroup_hierarchy()
    if not isinstance(hierarchy, Hierarchy):
        return None
    group = RunCgroup(hierarchy, run_name())
    try:
        group.create((limits.memory_mb + HARNESS_MB) * 2**20, limits.max_processes + HARNESS_TASKS)
    except OSError:
        group.remove()
        raise
    return group


async def run_sandboxed(
    program: str,
    tests: Tests,
    limits: SandboxLimits,
    kind: SandboxKind,
) -> RunResult:
    """Run `program` in one process and `tests` against it in another, in a fresh sandbox."""
    group = run_cgroup(limits)
    try:
        launch = KINDS[kind](limits, group)
        try:
            return await _run(launch, program, tests, limits, group)
        finally:
            launch.close()
    finally:
        if group is not None:  # kills what is left and waits for it: off the loop
            await asyncio.to_thread(group.remove)


async def _run(
    launch: Launch, program: str, tests: Tests, limits: SandboxLimits, group: RunCgroup | None
) -> RunResult:
    started = time.monotonic()
    report_read, report_write = os.pipe()
    tests_read, tests_write = os.pipe()
    job = make_job(launch, program, tests.entry_point, limits, (report_write, tests_read))
    try:
        proc = await asyncio.create_subprocess_exec(
            *launch.argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=launch.env,
            cwd="/",
            start_new_session=True,
            pass_fds=(*launch.pass_fds, report_write, tests_read),
        )
    except BaseException:
        for fd in (report_read, report_write, tests_read, tests_write):
            os.close(fd)
        raise
    finally:
        launch.started()
    os.close(report_write)
    os.close(tests_read)
    reports_stream = await _reader(report_read)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    def kill() -> None:
        launch.kill(proc.pid)
        if group is not None:
            group.kill_once()

    over_mb = 0.0

    async def guard() -> None:
        """Without a cgroup, the tree's memory in total (`watch.py`)."""
        nonlocal over_mb
        over_mb = await watch.over_memory(proc.pid, limits.memory_mb + HARNESS_MB)
        kill()

    guarding = asyncio.create_task(guard()) if group is None else None
    timed_out = False
    out, err, said = (b"", False), (b"", False), (b"", False)
    try:
        async with asyncio.timeout(limits.timeout_s):
            await _send(tests_write, marshal.dumps(tests.model_dump()))
            tests_write = -1
            proc.stdin.write(marshal.dumps(job))
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await proc.stdin.drain()
            proc.stdin.close()
            out, err, said = await asyncio.gather(
                _drain(proc.stdout, limits.max_output_bytes, kill),
                _drain(proc.stderr, limits.max_output_bytes, kill),
                _drain(reports_stream, MAX_REPORT_BYTES, kill),
            )
            await proc.wait()
    except TimeoutError:
        timed_out = True
    finally:
        if guarding is not None:
            guarding.cancel()
        if tests_write >= 0:
            os.close(tests_write)
        if proc.returncode is None:
            kill()
            await proc.wait()
        if timed_out or out[1] or err[1] or said[1]:  # read the killed tree's pipes to EOF
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await asyncio.gather(*map(_discard, (proc.stdout, proc.stderr, reports_stream)))
    deadline = time.monotonic() + 2.0  # everything dies with the namespace; wait to see it
    while not launch.gone() and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    stderr_text = err[0].decode("utf-8", "replace")
    if proc.returncode == SETUP_FAILED and "sandbox setup failed" in stderr_text:
        raise SandboxUnavailable(stderr_text.strip().splitlines()[-1])
    output = out[0].decode("utf-8", "replace")
    return RunResult(
        reports=parse_reports(said[0]),
        exit_code=proc.returncode,
        timed_out=timed_out,
        output_overflow=out[1] or err[1] or said[1],
        stderr_tail=(output[-500:] + "\n" + stderr_text[-500:]).strip(),
        seconds=time.monotonic() - started,
        oom_kills=group.oom_kills() if group is not None else 0,
        over_memory_mb=over_mb,
    )


def parse_reports(data: bytes) -> list[dict[str, object]]:
    """The judge's lines (a dict each); anything else is skipped."""
    reports = []
    for line in data.decode("utf-8", "replace").splitlines():
        try:
            report = ast.literal_eval(line)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        if isinstance(report, dict):
            reports.append(report)
    return reports


TRIVIAL = Tests(support="def f():\n    pass\n", test="", units=["assert f() == 1"], entry_point="f")


@cache
def sandbox_problem(kind: SandboxKind) -> str | None:
    """Why `kind` cannot run code here (a precondition, or a trivial run that failed), or None.
    Cached: the answer is a fact about the machine and the user."""
    reason = PRECONDITIONS[kind]()
    if reason is not None:
        return reason
    limits = SandboxLimits(timeout_s=10)
    run = run_sandboxed("def f():\n    return 1\n", TRIVIAL, limits, kind)
    try:  # in a thread with a loop of its own: the caller may be inside a running loop
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            result = pool.submit(asyncio.run, run).result()
    except (OSError, SandboxUnavailable) as error:
        return f"a trivial run failed: {error}"
    if result.timed_out:
        return f"a trivial run took over {limits.timeout_s:.0f} s"
    if result.exit_code == 0 and {"kind": "unit", "index": 0, "ok": True} in result.reports:
        return None
    said = result.stderr_tail.strip().splitlines() or ["no output"]
    hint = f"; {bwrap.HINT}" if kind == "bwrap" else ""
    return f"a trivial run failed (exit {result.exit_code}): {said[-1][:300]}{hint}"


def choose_sandbox(requested: SandboxChoice = "auto") -> SandboxKind:
    """The sandbox to use: as asked, or for "auto" the root one when it works, else bubblewrap.
    Raises SandboxUnavailable with each candidate's reason when none works."""
    kinds: list[SandboxKind] = ["root", "bwrap"] if requested == "auto" else [requested]
    problems: dict[SandboxKind, str] = {}
    for kind in kinds:
        problem = sandbox_problem(kind)
        if problem is None:
            return kind
        problems[kind] = problem
    said = "; ".join(f"{kind} sandbox: {problem}" for kind, problem in problems.items())
    raise SandboxUnavailable(f"no code sandbox can run here ({said})")


def sandbox_unavailable_reason(requested: SandboxChoice = "auto") -> str | None:
    """Why no sandbox (or not the one asked for) can run code here, or None when one can."""
    try:
        choose_sandbox(requested)
    except SandboxUnavailable as error:
        return str(error)
    return None
