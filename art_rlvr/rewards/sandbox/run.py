"""Run a program and its tests in a sandbox and collect the harness's reports; pick a sandbox."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import marshal
import secrets
import subprocess
import time
from collections.abc import Callable
from functools import cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from art_rlvr.rewards.sandbox import bwrap, root
from art_rlvr.rewards.sandbox.spec import SETUP_FAILED, Launch, SandboxKind, SandboxLimits

SandboxChoice = Literal["auto", "root", "bwrap"]
KINDS: dict[SandboxKind, Callable[[SandboxLimits], Launch]] = {
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


class SandboxUnavailable(RuntimeError):
    """No code sandbox can run on this machine (or not the one asked for)."""


class RunResult(BaseModel):
    """What came back from one sandboxed run, before it is turned into a Score."""

    model_config = ConfigDict(frozen=True)

    reports: list[dict[str, Any]]
    exit_code: int | None
    timed_out: bool
    output_overflow: bool
    stderr_tail: str
    seconds: float


def make_job(
    launch: Launch,
    program: str,
    test: str,
    units: list[str],
    entry_point: str | None,
    limits: SandboxLimits,
) -> dict[str, Any]:
    return {
        **launch.job,
        "program": program,
        "test": test,
        "units": units,
        "entry_point": entry_point,
        "nonce": secrets.token_hex(16),
        "limits": limits.rlimits(),
        "env": JOB_ENV,
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


async def run_sandboxed(
    program: str,
    test: str,
    units: list[str],
    entry_point: str | None,
    limits: SandboxLimits,
    kind: SandboxKind,
) -> RunResult:
    """Run `program`, then the test source, then each unit; all inside a fresh sandbox."""
    launch = KINDS[kind](limits)
    job = make_job(launch, program, test, units, entry_point, limits)
    try:
        return await _run(launch, job, limits)
    finally:
        launch.close()


async def _run(launch: Launch, job: dict[str, Any], limits: SandboxLimits) -> RunResult:
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *launch.argv,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=launch.env,
        cwd="/",
        start_new_session=True,
        pass_fds=launch.pass_fds,
    )
    launch.started()
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    kill = lambda: launch.kill(proc.pid)  # noqa: E731
    timed_out = False
    out, err = (b"", False), (b"", False)
    try:
        proc.stdin.write(marshal.dumps(job))
        await proc.stdin.drain()
        proc.stdin.close()
        async with asyncio.timeout(limits.timeout_s):
            out, err = await asyncio.gather(
                _drain(proc.stdout, limits.max_output_bytes, kill),
                _drain(proc.stderr, limits.max_output_bytes, kill),
            )
            await proc.wait()
    except TimeoutError:
        timed_out = True
    except (BrokenPipeError, ConnectionResetError):
        pass
    finally:
        if proc.returncode is None:
            kill()
            await proc.wait()
        if timed_out or out[1] or err[1]:  # read the killed tree's pipes to EOF: no fd leaks
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await asyncio.gather(_discard(proc.stdout), _discard(proc.stderr))
    deadline = time.monotonic() + 2.0  # everything dies with the namespace; wait to see it
    while not launch.gone() and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    stderr_text = err[0].decode("utf-8", "replace")
    if proc.returncode == SETUP_FAILED and "sandbox setup failed" in stderr_text:
        raise SandboxUnavailable(stderr_text.strip().splitlines()[-1])
    return RunResult(
        reports=parse_reports(out[0], job["nonce"]),
        exit_code=proc.returncode,
        timed_out=timed_out,
        output_overflow=out[1] or err[1],
        stderr_tail=stderr_text[-500:],
        seconds=time.monotonic() - started,
    )


def parse_reports(stdout: bytes, nonce: str) -> list[dict[str, Any]]:
    reports = []
    prefix = nonce + " "
    for line in stdout.decode("utf-8", "replace").splitlines():
        if line.startswith(prefix):
            try:
                report = ast.literal_eval(line[len(prefix) :])
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                continue
            if isinstance(report, dict):
                reports.append(report)
    return reports


@cache
def sandbox_problem(kind: SandboxKind) -> str | None:
    """Why `kind` cannot run code here (a precondition, or a trivial run that failed), or None.
    Cached: the answer is a fact about the machine and the user."""
    reason = PRECONDITIONS[kind]()
    if reason is not None:
        return reason
    limits = SandboxLimits(timeout_s=10)
    launch = KINDS[kind](limits)
    job = make_job(launch, "def f():\n    return 1\n", "", ["assert f() == 1"], "f", limits)
    try:
        with subprocess.Popen(
            launch.argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=launch.env,
            cwd="/",
            start_new_session=True,
            pass_fds=launch.pass_fds,
        ) as proc:
            launch.started()
            try:
                stdout, stderr = proc.communicate(marshal.dumps(job), timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                launch.kill(proc.pid)
                return f"a trivial run took over {limits.timeout_s:.0f} s"
    except OSError as error:
        return f"a trivial run failed: {error}"
    finally:
        launch.close()
    reports = parse_reports(stdout, job["nonce"])
    if proc.returncode == 0 and {"kind": "unit", "index": 0, "ok": True} in reports:
        return None
    said = stderr.decode("utf-8", "replace").strip().splitlines() or ["no output"]
    hint = f"; {bwrap.HINT}" if kind == "bwrap" else ""
    return f"a trivial run failed (exit {proc.returncode}): {said[-1][:300]}{hint}"


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
