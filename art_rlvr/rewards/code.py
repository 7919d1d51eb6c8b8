"""Code rewards: run the completion against the task's tests in a throwaway sandbox.

Model-written code is hostile by default. Each run happens in a fresh process tree that:

- lives in new mount, PID, network, IPC and UTS namespaces (so: no network at all, it sees only
  its own processes, and everything in it dies when its init process exits);
- is `chroot`ed into a read-only tmpfs holding only /usr, the Python install and four /dev nodes,
  with a writable, size-limited tmpfs at /tmp/work (the host's home, /tmp, /work... are absent);
- runs as a fresh unprivileged uid with no_new_privs and resource limits (address space, CPU
  seconds, process count, file size, open files), and an environment built from nothing;
- is killed as a whole on a wall-clock timeout or when its output passes a cap.

The only Python started per run is the launcher (`python -S -c _LAUNCHER`): it builds the
namespaces as root, then forks a tiny init and the test process, which drops to the throwaway
uid and runs the tests in-process. A trivial run takes ~30 ms on 2 cores (~21 ms more than a
bare `python -S -c pass`). It needs root (CI and these machines run as root);
without root the reward refuses to build rather than run code unconfined.

Threat model: damage is contained; a program that deliberately forges the harness's reports
from inside its own process could still fake a pass (the per-run nonce makes that take intent).
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import itertools
import marshal
import math
import os
import re
import secrets
import signal
import sys
import time
import weakref
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from art_rlvr.rewards.base import Record, RewardConfigError, Score, first_error

UID_BASE = 2_100_000_000  # throwaway uids live in [UID_BASE, UID_BASE + UID_SPAN)
UID_SPAN = 1_000_000
SETUP_FAILED = 125
_MAX_COMPLETION_CHARS = 100_000
_uids = itertools.count()

# Runs as root in `python -S -s -P -c`. Reads one marshalled job from stdin. Exit codes: the test
# process's (0 = harness finished), 128+signal when it was killed, 125 when setup failed.
_LAUNCHER = r"""
import ctypes, marshal, os, resource, signal, sys
job = marshal.loads(sys.stdin.buffer.read())
libc = ctypes.CDLL(None, use_errno=True)
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
ROOT = "/tmp"

def fail(message):
    os.write(2, ("sandbox setup failed: " + message + "\n").encode())
    os._exit(125)

def mount(src, dst, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    if libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, "mount %s: %s" % (dst, os.strerror(err)))

def bind_ro(src, dst):
    mount(src, dst, None, BIND | REC)
    mount(None, dst, None, REMOUNT | BIND | RDONLY | NOSUID | NODEV)

def build_root(uid):
    os.unshare(os.CLONE_NEWNS | os.CLONE_NEWNET | os.CLONE_NEWPID | os.CLONE_NEWIPC
               | os.CLONE_NEWUTS)
    mount(None, "/", None, REC | PRIVATE)
    mount("sandbox", ROOT, "tmpfs", NOSUID, "size=1m,mode=0755")
    for name in ("usr", "bin", "lib", "lib64", "sbin"):
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), ROOT + host)
        elif os.path.isdir(host):
            os.mkdir(ROOT + host)
            bind_ro(host, ROOT + host)
    prefixes = (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)
    for prefix in sorted({os.path.realpath(p) for p in prefixes}):
        if not prefix.startswith("/usr/") and not os.path.isdir(ROOT + prefix):
            os.makedirs(ROOT + prefix, exist_ok=True)
            bind_ro(prefix, ROOT + prefix)
    os.makedirs(ROOT + "/dev")
    for node in ("null", "zero", "random", "urandom"):
        open(ROOT + "/dev/" + node, "w").close()
        mount("/dev/" + node, ROOT + "/dev/" + node, None, BIND)
    os.mkdir(ROOT + "/proc")
    os.mkdir(ROOT + "/tmp")
    mount("work", ROOT + "/tmp", "tmpfs", NOSUID | NODEV,
          "size=%dm,mode=0755" % job["tmp_mb"])
    os.mkdir(ROOT + "/tmp/work", 0o700)
    os.chown(ROOT + "/tmp/work", uid, uid)
    mount(None, ROOT, None, REMOUNT | RDONLY | NOSUID)

def limit(uid):
    for name, value in job["limits"].items():
        hard = value + 1 if name == "RLIMIT_CPU" else value  # SIGXCPU first, then SIGKILL
        resource.setrlimit(getattr(resource, name), (value, hard))
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS

def status_of(pid):
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return status
        except ChildProcessError:
            return 0

def exit_like(status):
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))

def harness():
    import builtins
    report_fd = os.dup(1)
    nonce = job["nonce"]
    def report(kind, **fields):
        fields["kind"] = kind
        line = "\n%s %r\n" % (nonce, fields)
        os.write(report_fd, line.encode("utf-8", "backslashreplace"))
    def last_line(error):
        try:
            text = str(error)
        except BaseException:
            text = "(unprintable)"
        name = type(error).__name__
        return (name + ": " + text if text else name)[:300]
    def finish():
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except BaseException:
            pass
        os._exit(0)
    try:
        code = compile(job["program"], "solution.py", "exec")
    except (SyntaxError, ValueError) as error:
        report("syntax_error", error=last_line(error))
        finish()
    space = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(code, space)
    except BaseException as error:
        report("definition_error", error=last_line(error))
        finish()
    try:
        exec(compile(job["test"], "tests.py", "exec"), space)
    except BaseException as error:
        report("definition_error", error="while loading the tests: " + last_line(error))
        finish()
    entry = job["entry_point"]
    if entry is not None:
        if not callable(space.get(entry)):
            report("missing_function", error="no function named %r" % entry)
            finish()
        space["candidate"] = space[entry]
    for index, unit in enumerate(job["units"]):
        try:
            exec(compile(unit, "test_%d" % index, "exec"), space)
        except AssertionError as error:
            report("unit", index=index, ok=False, error=last_line(error))
        except BaseException as error:
            kind = "memory" if isinstance(error, MemoryError) else "error"
            report("unit", index=index, ok=False, error=last_line(error), failure=kind)
        else:
            report("unit", index=index, ok=True)
    report("done")
    finish()

uid = job["uid"]
try:
    build_root(uid)
    launcher_alarm = job["limits"]["RLIMIT_CPU"] + 2
    init = os.fork()
except BaseException as error:
    fail(repr(error))
if init == 0:
    try:
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: die with the launcher
        mount("proc", ROOT + "/proc", "proc", NOSUID | NODEV | NOEXEC)
        os.chroot(ROOT)
        os.chdir("/tmp/work")
        os.environ.clear()
        os.environ.update(job["env"])
        worker = os.fork()
    except BaseException as error:
        fail(repr(error))
    if worker == 0:
        try:
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            limit(uid)
        except BaseException as error:
            fail(repr(error))
        harness()
    exit_like(status_of(worker))  # init leaving ends the namespace: everything in it dies
signal.signal(signal.SIGALRM, lambda *_: (os.kill(init, signal.SIGKILL), os._exit(124)))
signal.alarm(launcher_alarm)
exit_like(status_of(init))
"""


class SandboxLimits(BaseModel):
    """Per-run limits; the defaults fit HumanEval-style unit tests with room to spare."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout_s: float = Field(default=6.0, gt=0, le=600)
    memory_mb: int = Field(default=1024, ge=64)
    max_processes: int = Field(default=8, ge=1, le=256)
    max_output_bytes: int = Field(default=256_000, ge=1024)
    max_file_mb: int = Field(default=16, ge=1)
    tmp_mb: int = Field(default=32, ge=1)

    def rlimits(self) -> dict[str, int]:
        return {
            "RLIMIT_AS": self.memory_mb * 2**20,
            "RLIMIT_CPU": math.ceil(self.timeout_s),
            "RLIMIT_NPROC": self.max_processes,
            "RLIMIT_FSIZE": self.max_file_mb * 2**20,
            "RLIMIT_NOFILE": 256,
            "RLIMIT_CORE": 0,
        }


class RunResult(BaseModel):
    """What came back from one sandboxed run, before it is turned into a Score."""

    model_config = ConfigDict(frozen=True)

    reports: list[dict[str, Any]]
    exit_code: int | None
    timed_out: bool
    output_overflow: bool
    stderr_tail: str
    seconds: float


def sandbox_unavailable_reason() -> str | None:
    """Why this machine cannot run the sandbox, or None when it can."""
    if not sys.platform.startswith("linux") or not hasattr(os, "unshare"):
        return "the code sandbox needs Linux namespaces (Python >= 3.12 on Linux)"
    if os.geteuid() != 0:
        return (
            "the code sandbox needs root (it builds mount/PID/network namespaces and runs the "
            "code as a throwaway uid); run as root, e.g. in a container"
        )
    return None


def _next_uid() -> int:
    return UID_BASE + ((os.getpid() % 1000) * 1000 + next(_uids) % 1000) % UID_SPAN


def sandbox_processes() -> list[int]:
    """PIDs of live processes owned by any throwaway sandbox uid (for cleanup checks)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            uid = entry.stat().st_uid
        except OSError:
            continue
        if UID_BASE <= uid < UID_BASE + UID_SPAN:
            found.append(int(entry.name))
    return found


def _uid_gone(uid: int) -> bool:
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and entry.stat().st_uid == uid:
                return False
        except OSError:
            continue
    return True


_limiters: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, asyncio.Semaphore]] = (
    weakref.WeakKeyDictionary()
)


def _limiter(concurrency: int) -> asyncio.Semaphore:
    """One semaphore per event loop and width: sandboxes are CPU-bound processes."""
    per_loop = _limiters.setdefault(asyncio.get_running_loop(), {})
    return per_loop.setdefault(concurrency, asyncio.Semaphore(concurrency))


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


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


async def run_sandboxed(
    program: str,
    test: str,
    units: list[str],
    entry_point: str | None,
    limits: SandboxLimits,
) -> RunResult:
    """Run `program`, then the test source, then each unit; all inside a fresh sandbox."""
    uid = _next_uid()
    nonce = secrets.token_hex(16)
    job = {
        "program": program,
        "test": test,
        "units": units,
        "entry_point": entry_point,
        "nonce": nonce,
        "uid": uid,
        "tmp_mb": limits.tmp_mb,
        "limits": limits.rlimits(),
        "env": {
            "PATH": "/usr/bin:/bin",
            "HOME": "/tmp/work",
            "TMPDIR": "/tmp/work",
            "LANG": "C.UTF-8",
            "PYTHONHASHSEED": "0",
        },
    }
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        os.path.realpath(sys.executable),
        "-S",
        "-s",
        "-P",
        "-c",
        _LAUNCHER,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={"PYTHONHASHSEED": "0"},
        cwd="/",
        start_new_session=True,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    kill = lambda: _kill_group(proc.pid)  # noqa: E731
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
    overflow = out[1] or err[1]
    if timed_out or overflow:
        deadline = time.monotonic() + 2.0  # the namespace dies with its init; wait to see it
        while not _uid_gone(uid) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    stderr_text = err[0].decode("utf-8", "replace")
    if proc.returncode == SETUP_FAILED and "sandbox setup failed" in stderr_text:
        raise RuntimeError(stderr_text.strip().splitlines()[-1])
    return RunResult(
        reports=_parse_reports(out[0], nonce),
        exit_code=proc.returncode,
        timed_out=timed_out,
        output_overflow=overflow,
        stderr_tail=stderr_text[-500:],
        seconds=time.monotonic() - started,
    )


def _parse_reports(stdout: bytes, nonce: str) -> list[dict[str, Any]]:
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


# --- turning a completion into a program ------------------------------------------------------

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.DOTALL | re.IGNORECASE)


def _defines(source: str, name: str) -> bool:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return False
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name
        for node in tree.body
    )


def extract_code(completion: str, entry_point: str | None = None) -> str:
    """The code in a completion: a fenced block (the one defining the entry point if any), an
    unterminated fence cut off by max_tokens, or the raw text."""
    blocks = [b for b in _FENCE.findall(completion) if b.strip()]
    if not blocks:
        return completion
    if entry_point:
        defining = [b for b in blocks if _defines(b, entry_point)]
        if defining:
            return defining[-1]
    return blocks[0]


def build_program(prompt: str, code: str, entry_point: str | None) -> str:
    """Whole function -> prompt (for its imports) then code; a body -> prompt + code."""
    if entry_point is None or not prompt:
        return code
    if _defines(code, entry_point):
        return prompt + "\n\n" + code.strip("\n") + "\n"
    joined = prompt + code
    if not _compiles(joined):
        indented = prompt + "".join(
            "    " + line if line.strip() else line for line in code.splitlines(keepends=True)
        )
        # else the harness reports the syntax error against what the model wrote
        return indented if _compiles(indented) else joined
    return joined


def _compiles(source: str) -> bool:
    try:
        compile(source, "solution.py", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


@lru_cache(maxsize=1024)
def split_tests(test: str, entry_point: str | None) -> tuple[str, ...]:
    """Test units: each top-level statement of `check(candidate)` (or of the test file, when it
    has no `check`), so a failure says which test failed and partial credit is possible."""
    fallback = ("check(candidate)",) if entry_point else ()
    try:
        tree = ast.parse(test)
    except SyntaxError:
        return fallback
    check = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None
    )
    if check is None:
        return fallback
    params = [a.arg for a in check.args.args]
    if params != ["candidate"] or any(isinstance(n, ast.Return) for n in ast.walk(check)):
        return fallback
    units = tuple(ast.unparse(stmt) for stmt in check.body if not _is_docstring(stmt))
    return units or fallback


def _is_docstring(stmt: ast.stmt) -> bool:
    return (
        isinstance(stmt, ast.Expr)
        and isinstance(stmt.value, ast.Constant)
        and isinstance(stmt.value.value, str)
    )


# --- the reward -------------------------------------------------------------------------------


def describe(
    result: RunResult, units: tuple[str, ...], show_test: bool = True
) -> tuple[int, str, str]:
    """(tests passed, failure kind, feedback) from a run."""
    n_units = len(units)
    reports = result.reports
    ran = [r for r in reports if r.get("kind") == "unit"]
    passed = sum(1 for r in ran if r.get("ok"))
    done = any(r.get("kind") == "done" for r in reports)
    first_fail = next((r for r in ran if not r.get("ok")), None)
    early = next(
        (
            r
            for r in reports
            if r.get("kind") in ("syntax_error", "definition_error", "missing_function")
        ),
        None,
    )
    progress = f"{passed}/{n_units} tests passed"
    if result.output_overflow:
        return passed, "output_limit", f"output limit exceeded ({progress} before it was stopped)"
    if result.timed_out or result.exit_code in (124, 128 + signal.SIGXCPU):
        return passed, "timeout", f"timeout ({progress} before it was stopped)"
    if early is not None:
        kind = str(early["kind"])
        label = {
            "syntax_error": "syntax error",
            "definition_error": "runtime error while defining the solution",
            "missing_function": "missing function",
        }[kind]
        return passed, kind, f"{label}: {early.get('error', '')}"
    if done and first_fail is None and passed == n_units:
        return passed, "passed", f"all {n_units} tests passed"
    if first_fail is not None:
        error = str(first_fail.get("error", ""))
        index = int(first_fail.get("index", 0))
        which = f"test {index + 1} of {n_units}"
        if show_test and 0 <= index < n_units:
            which += f" `{_shorten(units[index])}`"
        if first_fail.get("failure") == "memory":
            return passed, "memory", f"memory limit: {which} raised {error} ({progress})"
        if first_fail.get("failure") == "error":
            return passed, "runtime_error", f"runtime error in {which}: {error} ({progress})"
        detail = f": {error}" if error and error != "AssertionError" else ""
        return passed, "wrong_answer", f"wrong answer: {which} failed{detail} ({progress})"
    code = result.exit_code
    last = [line.strip() for line in result.stderr_tail.splitlines() if line.strip()]
    said = f"; stderr: {_shorten(last[-1])}" if last else ""
    if code is not None and code > 128:
        name = signal.Signals(code - 128).name if code - 128 in signal.valid_signals() else code
        return passed, "crashed", f"crashed: killed by {name} ({progress}){said}"
    return passed, "crashed", f"exited before the tests finished (exit {code}; {progress}){said}"


def _shorten(text: str, limit: int = 160) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


class CodeReward(BaseModel):
    """Reward 1 when every test unit passes (or the fraction passed, with partial_credit)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    prompt_field: str = "prompt"
    test_field: str = "test"
    entry_point_field: str | None = "entry_point"
    partial_credit: bool = False
    show_failed_test: bool = True
    # a run is partly kernel work (namespaces, mounts, teardown): 2 per core beats 1 per core
    concurrency: int = Field(default_factory=lambda: 2 * (os.cpu_count() or 1), ge=1)
    limits: SandboxLimits = SandboxLimits()

    async def __call__(self, x: Record, y: str) -> Score:
        y = y if isinstance(y, str) else ""
        entry = str(x[self.entry_point_field]) if self.entry_point_field else None
        test = str(x[self.test_field])
        units = split_tests(test, entry)
        if not y.strip():
            return _zero("no code in the answer", "no_code", len(units))
        if len(y) > _MAX_COMPLETION_CHARS:
            return _zero("answer too long to run", "no_code", len(units))
        code = extract_code(y.replace("\x00", ""), entry)
        program = build_program(str(x.get(self.prompt_field, "")), code, entry)
        async with _limiter(self.concurrency):
            result = await run_sandboxed(program, test, list(units), entry, self.limits)
        passed, kind, feedback = describe(result, units, self.show_failed_test)
        total = max(len(units), 1)
        correct = kind == "passed"
        reward = 1.0 if correct else (passed / total if self.partial_credit else 0.0)
        return Score(
            reward=reward,
            feedback=feedback,
            metrics={
                "correct": float(correct),
                "tests_passed": float(passed),
                "tests_total": float(len(units)),
                "pass_fraction": passed / total,
                "format": float("```" in y),
                "timeout": float(kind == "timeout"),
            },
        )


def _zero(feedback: str, kind: str, n_units: int) -> Score:
    return Score(
        reward=0.0,
        feedback=feedback,
        metrics={
            "correct": 0.0,
            "tests_passed": 0.0,
            "tests_total": float(n_units),
            "pass_fraction": 0.0,
            "format": 0.0,
            "timeout": 0.0,
        },
    )


def code(**params) -> CodeReward:
    reason = sandbox_unavailable_reason()
    if reason is not None:
        raise RewardConfigError(f"reward 'code': {reason}")
    try:
        return CodeReward(**params)
    except ValidationError as error:
        raise RewardConfigError(f"bad parameters for reward 'code': {first_error(error)}") from None
