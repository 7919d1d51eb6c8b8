"""The process that runs one sandboxed job: `python -S -s -P launcher.py < marshalled job`.

It is started by path, not imported: it runs with no site-packages, as root on the host or
inside bubblewrap, so it uses the standard library only. Its job's "mode" says which:

- "root": join the run's cgroups, build mount/PID/network/IPC/UTS namespaces and a read-only
  chroot, fork an init (whose exit ends the namespace) that supervises;
- "inside": bubblewrap has built the namespaces and the root already and runs this as an
  unprivileged user: supervise.

The supervisor makes itself undumpable (so no process of the run can read its memory or open
its descriptors through /proc) and forks two processes that drop to the run's uid:

- the solution's process: runs the program and answers calls of its functions, arguments and
  results as plain data (`encode`) over a pair of pipes; its output goes to stdout;
- the judge: reads the tests from their own descriptor (the solution's process never holds
  them, in memory or as a descriptor), runs them with each of the program's functions replaced
  by a proxy that calls it in the other process, and reports each unit as a line
  `{dict}` on the report descriptor, which only the judge and the supervisor hold.

So whatever the program does in its own process (an `__eq__` that is always true, walking the
frames for a secret, patching builtins, printing reports, exiting early) only changes what its
functions answer; the comparison happens in the judge, on values rebuilt from data. Exit code:
the judge's (0 = it finished), 128 + signal when it was killed, 125 when setup failed.
"""

import builtins
import json
import marshal
import os
import resource
import signal
import sys

SETUP_FAILED = 125
ROOT = "/tmp"  # the new root is built here, inside a private mount namespace
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 4, 22, 38
SECCOMP_MODE_FILTER = 2
MAX_MESSAGE = 16 * 2**20
PARKED = 1000  # descriptors are moved up here before being put in their places


def fail(message: str) -> None:
    os.write(2, ("sandbox setup failed: " + message + "\n").encode())
    os._exit(SETUP_FAILED)


class Libc:
    """mount(2) and prctl(2), which os lacks (ctypes, which costs a few ms to import)."""

    def __init__(self) -> None:
        import ctypes

        self.ctypes = ctypes
        self.lib = ctypes.CDLL(None, use_errno=True)

    def mount(self, src: str | None, dst: str, fstype: str | None, flags: int, data=None):
        enc = [None if s is None else s.encode() for s in (src, dst, fstype, data)]
        if self.lib.mount(enc[0], enc[1], enc[2], self.ctypes.c_ulong(flags), enc[3]) != 0:
            err = self.ctypes.get_errno()
            raise OSError(err, f"mount {dst}: {os.strerror(err)}")

    def bind_ro(self, src: str, dst: str) -> None:
        self.mount(src, dst, None, BIND | REC)
        self.mount(None, dst, None, REMOUNT | BIND | RDONLY | NOSUID | NODEV)

    def prctl(self, option: int, value: int) -> None:
        if self.lib.prctl(option, self.ctypes.c_ulong(value), 0, 0, 0) != 0:
            raise OSError(self.ctypes.get_errno(), f"prctl({option})")

    def seccomp(self, program: bytes) -> None:
        """Install a classic BPF filter (8 bytes an instruction); no_new_privs must be set."""
        ct = self.ctypes

        class Program(ct.Structure):  # type: ignore[name-defined]
            _fields_ = [("len", ct.c_ushort), ("filter", ct.c_char_p)]  # noqa: RUF012 (ctypes)

        prog = Program(len(program) // 8, program)
        if self.lib.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ct.byref(prog), 0, 0) != 0:
            raise OSError(ct.get_errno(), "seccomp")


def build_root(libc: Libc, uid: int, tmp_mb: int) -> None:
    """Namespaces, then a read-only tmpfs root: /usr, the Python install, four /dev nodes and a
    writable, size-limited /tmp/work owned by `uid`."""
    os.unshare(
        os.CLONE_NEWNS | os.CLONE_NEWNET | os.CLONE_NEWPID | os.CLONE_NEWIPC | os.CLONE_NEWUTS
    )
    libc.mount(None, "/", None, REC | PRIVATE)
    libc.mount("sandbox", ROOT, "tmpfs", NOSUID, "size=1m,mode=0755")
    for name in ("usr", "bin", "lib", "lib64", "sbin"):
        host = "/" + name
        if os.path.islink(host):
            os.symlink(os.readlink(host), ROOT + host)
        elif os.path.isdir(host):
            os.mkdir(ROOT + host)
            libc.bind_ro(host, ROOT + host)
    prefixes = (sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix)
    for prefix in sorted({os.path.realpath(p) for p in prefixes}):
        if not prefix.startswith("/usr/") and not os.path.isdir(ROOT + prefix):
            os.makedirs(ROOT + prefix, exist_ok=True)
            libc.bind_ro(prefix, ROOT + prefix)
    os.makedirs(ROOT + "/dev")
    for node in ("null", "zero", "random", "urandom"):
        open(ROOT + "/dev/" + node, "w").close()
        libc.mount("/dev/" + node, ROOT + "/dev/" + node, None, BIND)
    os.mkdir(ROOT + "/proc")
    os.mkdir(ROOT + "/tmp")
    libc.mount("work", ROOT + "/tmp", "tmpfs", NOSUID | NODEV, f"size={tmp_mb}m,mode=0755")
    os.mkdir(ROOT + "/tmp/work", 0o700)
    os.chown(ROOT + "/tmp/work", uid, uid)
    libc.mount(None, ROOT, None, REMOUNT | RDONLY | NOSUID)


def arrange(fds: list[int]) -> None:
    """Put `fds` at 3, 4, ... and close every other descriptor from 3 up."""
    for index, fd in enumerate(fds):
        os.dup2(fd, PARKED + index)
    for index in range(len(fds)):
        os.dup2(PARKED + index, 3 + index)
    os.closerange(3 + len(fds), 2**20)


def limit(limits: dict[str, int]) -> None:
    """stdin from /dev/null, and the resource limits."""
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for name, value in limits.items():
        hard = value + 1 if name == "RLIMIT_CPU" else value  # SIGXCPU first, then SIGKILL
        resource.setrlimit(getattr(resource, name), (value, hard))


def become(job: dict, libc: Libc) -> None:
    """The limits, the run's uid (as root), no new privileges, the fallback's seccomp filter;
    and undumpable again (a change of uid may have made it dumpable). RLIMIT_NPROC counts the
    uid's processes: the judge's (as root), or also bwrap's init's and the supervisor's."""
    harness = 1 if job["mode"] == "root" else 3
    limit({**job["limits"], "RLIMIT_NPROC": job["limits"]["RLIMIT_NPROC"] + harness})
    if job["mode"] == "root":
        os.setgroups([])
        os.setgid(job["uid"])
        os.setuid(job["uid"])
        libc.prctl(PR_SET_NO_NEW_PRIVS, 1)
        if job["seccomp"]:
            libc.seccomp(job["seccomp"])
    libc.prctl(PR_SET_DUMPABLE, 0)


def last_line(error: BaseException) -> str:
    try:
        text = str(error)
    except BaseException:
        text = "(unprintable)"
    name = type(error).__name__
    return (name + ": " + text if text else name)[:300]


# --- plain data ---------------------------------------------------------------------------------

PLAIN = (
    "plain data (None, bool, int, float, complex, str, bytes, and lists, tuples, sets and "
    "dicts of them)"
)


class NotPlain(TypeError):
    """A value that cannot cross between the processes as data."""


def encode(value, depth: int = 0):
    """A JSON-able, tagged form of plain data that keeps exact types (exact floats too)."""
    kind = type(value)
    if depth > 100:
        raise NotPlain("nested over 100 deep")
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        return {"int": hex(value)}
    if kind is float:
        return {"float": value.hex()}
    if kind is complex:
        return {"complex": [value.real.hex(), value.imag.hex()]}
    if kind is bytes:
        return {"bytes": value.hex()}
    if kind in (list, tuple, set, frozenset):
        return {kind.__name__: [encode(item, depth + 1) for item in value]}
    if kind is dict:
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    raise NotPlain(f"a {kind.__name__}")


SEQUENCES = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}


def decode(data):
    """The value `encode` gave `data` for; builtin types only, whatever the data says."""
    if data is None or type(data) in (bool, str):
        return data
    if type(data) is not dict or len(data) != 1:
        raise ValueError("not tagged data")
    ((tag, body),) = data.items()
    if tag == "int":
        return int(str(body), 16)
    if tag == "float":
        return float.fromhex(str(body))
    if tag == "complex":
        real, imag = body
        return complex(float.fromhex(str(real)), float.fromhex(str(imag)))
    if tag == "bytes":
        return bytes.fromhex(str(body))
    if tag in SEQUENCES:
        return SEQUENCES[tag](decode(item) for item in body)
    if tag == "dict":
        return {decode(k): decode(v) for k, v in body}
    raise ValueError(f"unknown tag {tag!r}")


class Channel:
    """Length-prefixed JSON messages over a pair of pipes."""

    def __init__(self, read_fd: int, write_fd: int) -> None:
        self.read_fd, self.write_fd = read_fd, write_fd

    def send(self, message: dict) -> None:
        data = json.dumps(message).encode("utf-8", "surrogatepass")
        data = len(data).to_bytes(4, "big") + data
        while data:
            data = data[os.write(self.write_fd, data) :]

    def _exactly(self, size: int) -> bytes | None:
        parts, left = [], size
        while left:
            chunk = os.read(self.read_fd, min(left, 2**20))
            if not chunk:
                return None
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)

    def receive(self):
        """The next message; None at the end; ValueError for one that is no message."""
        head = self._exactly(4)
        if head is None:
            return None
        size = int.from_bytes(head, "big")
        if size > MAX_MESSAGE:
            raise ValueError(f"a message of {size} bytes (over {MAX_MESSAGE})")
        body = self._exactly(size)
        if body is None:
            return None
        message = json.loads(body.decode("utf-8", "surrogatepass"))
        if type(message) is not dict:
            raise ValueError("not a message")
        return message


# --- the solution's process ---------------------------------------------------------------------


def solve(job: dict, channel: Channel) -> None:
    """Run the program; say whether it defines what the tests call; then answer calls."""
    try:
        code = compile(job["program"], "solution.py", "exec")
    except (SyntaxError, ValueError) as error:
        channel.send({"kind": "syntax_error", "error": last_line(error)})
        os._exit(0)
    space = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(code, space)
    except BaseException as error:
        channel.send({"kind": "definition_error", "error": last_line(error)})
        os._exit(0)
    entry = job["entry_point"]
    if entry is not None and not callable(space.get(entry)):
        channel.send({"kind": "missing_function", "error": f"no function named {entry!r}"})
        os._exit(0)
    names = [] if entry else [k for k, v in list(space.items()) if type(k) is str and callable(v)]
    channel.send({"kind": "ready", "names": names})
    while (request := channel.receive()) is not None:
        channel.send(answer(space, request))
    os._exit(0)


def answer(space: dict, request: dict) -> dict:
    try:
        function = space[request["call"]]
        args, kwargs = decode(request["args"]), decode(request["kwargs"])
        value = function(*args, **kwargs)
    except BaseException as error:
        failure = "memory" if isinstance(error, MemoryError) else "error"
        return {"kind": "raised", "name": type(error).__name__, "error": last_line(error),
                "failure": failure}  # fmt: skip
    try:
        return {"kind": "value", "value": encode(value)}
    except NotPlain as error:
        return {"kind": "not_plain", "error": str(error)}
    except BaseException as error:  # a value whose hashing or iteration raised
        return {"kind": "not_plain", "error": last_line(error)}


# --- the judge ----------------------------------------------------------------------------------


class SolutionGone(BaseException):
    """The solution's process ended (or answered nonsense): no test can go on. A BaseException
    so that a test's own `except Exception` cannot swallow it."""


def raised(reply: dict) -> BaseException:
    """The exception a call raised in the other process, as a builtin exception of that name
    (so a test that expects a ValueError sees one), else a RuntimeError."""
    name = str(reply.get("name", ""))
    kind = getattr(builtins, name, None)
    message = str(reply.get("error", name))[:300]
    stop = (SystemExit, KeyboardInterrupt, GeneratorExit)
    if isinstance(kind, type) and issubclass(kind, Exception) and not issubclass(kind, stop):
        try:
            return kind(message.partition(": ")[2] or message)
        except BaseException:
            pass
    return RuntimeError(f"the solution raised {message}")


def proxy(channel: Channel, name: str):
    """A stand-in for the solution's function `name`: arguments go over as data, the result
    comes back as data."""

    def call(*args, **kwargs):
        try:
            request = {"call": name, "args": encode(args), "kwargs": encode(kwargs)}
        except NotPlain as error:
            raise TypeError(f"cannot pass {error} to {name}: arguments cross as {PLAIN}") from None
        channel.send(request)
        try:
            reply = channel.receive()
        except ValueError as error:
            raise SolutionGone(f"the solution's process answered nonsense ({error})") from None
        if reply is None:
            raise SolutionGone("the solution's process ended")
        kind = reply.get("kind")
        if kind == "value":
            try:
                return decode(reply.get("value"))
            except (ValueError, TypeError, OverflowError, RecursionError) as error:
                raise SolutionGone(f"the solution's process answered nonsense ({error})") from None
        if kind == "raised":
            if reply.get("failure") == "memory":
                raise MemoryError(str(reply.get("error", "")))
            raise raised(reply)
        if kind == "not_plain":
            raise TypeError(
                f"{name} returned {reply.get('error')}; results are compared as {PLAIN}"
            )
        raise SolutionGone("the solution's process answered nonsense")

    call.__name__ = name
    return call


def judge(tests: dict, channel: Channel, report) -> None:
    """Run the support code (the prompt's helpers), the tests' source and each unit, with the
    program's functions as proxies; report each step."""
    try:
        hello = channel.receive()
    except ValueError:
        hello = {"kind": "definition_error", "error": "the solution's process answered nonsense"}
    if hello is None:
        report("definition_error", error="the solution's process ended while defining it",
               failure="exited")  # fmt: skip
        return
    if hello.get("kind") != "ready":
        kind = hello.get("kind")
        kind = kind if kind in ("syntax_error", "definition_error", "missing_function") else None
        report(kind or "definition_error", error=str(hello.get("error", ""))[:300])
        return
    space = {"__name__": "__main__", "__builtins__": builtins}
    try:  # noqa: SIM105 (contextlib costs an import in a launcher that starts per run)
        exec(compile(tests["support"], "prompt.py", "exec"), space)
    except BaseException:
        pass  # not Python (an MBPP-style text prompt): nothing to borrow from it
    entry = tests["entry_point"]
    if entry is not None:
        space["candidate"] = space[entry] = proxy(channel, entry)
    else:  # the tests call the program's functions by name: those, but never a builtin or a
        # helper of the prompt's (a program's own `abs` or `poly` must not judge it)
        names = [n for n in hello.get("names", []) if type(n) is str][:10000]
        for name in names:
            if name.isidentifier() and not hasattr(builtins, name) and name not in space:
                space[name] = proxy(channel, name)
    try:
        exec(compile(tests["test"], "tests.py", "exec"), space)
    except SolutionGone as error:
        report("unit", index=0, ok=False, error=last_line(error), failure="exited")
        return
    except BaseException as error:
        report("definition_error", error="while loading the tests: " + last_line(error))
        return
    gone = None
    for index, unit in enumerate(tests["units"]):
        if gone is not None:
            report("unit", index=index, ok=False, error=gone, failure="exited")
            continue
        try:
            exec(compile(unit, f"test_{index}", "exec"), space)
        except SolutionGone as error:
            gone = last_line(error)
            report("unit", index=index, ok=False, error=gone, failure="exited")
        except AssertionError as error:
            report("unit", index=index, ok=False, error=last_line(error))
        except BaseException as error:
            kind = "memory" if isinstance(error, MemoryError) else "error"
            report("unit", index=index, ok=False, error=last_line(error), failure=kind)
        else:
            report("unit", index=index, ok=True)
    report("done")


def reporter(fd: int):
    def report(kind: str, **fields) -> None:
        fields["kind"] = kind
        os.write(fd, (repr(fields) + "\n").encode("utf-8", "backslashreplace"))

    return report


def read_all(fd: int) -> bytes:
    parts = []
    while chunk := os.read(fd, 1 << 16):
        parts.append(chunk)
    return b"".join(parts)


# --- the supervisor -----------------------------------------------------------------------------


def supervise(job: dict, libc: Libc) -> None:
    """Fork the solution's process and the judge; report how the solution's process ended if it
    ended first; exit as the judge did (everything else dies with the namespace)."""
    try:
        libc.prctl(PR_SET_DUMPABLE, 0)  # inherited: no process of the run can read another's
        to_solution, to_judge = os.pipe(), os.pipe()
        solution = os.fork()
    except BaseException as error:
        fail(repr(error))
    if solution == 0:
        try:
            arrange([to_solution[0], to_judge[1]])
            os.dup2(1, 2)  # its stderr joins its stdout: the report descriptor is not there
            become(job, libc)
        except BaseException as error:
            fail(repr(error))
        solve(job, Channel(3, 4))
    try:
        judge_pid = os.fork()
    except BaseException as error:
        fail(repr(error))
    if judge_pid == 0:
        try:
            arrange([job["report_fd"], job["tests_fd"], to_judge[0], to_solution[1]])
            null = os.open("/dev/null", os.O_WRONLY)
            os.dup2(null, 1)  # the tests' own prints go nowhere
            become(job, libc)
            tests = marshal.loads(read_all(4))
            os.close(4)
        except BaseException as error:
            fail(repr(error))
        judge(tests, Channel(5, 6), reporter(3))
        os._exit(0)
    for fd in (*to_solution, *to_judge, job["tests_fd"]):
        os.close(fd)
    report = reporter(job["report_fd"])
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            os._exit(0)
        if pid == solution:
            solution = -1
            report("solution_exit", status=status)
        elif pid == judge_pid:
            if solution > 0:
                os.kill(solution, signal.SIGKILL)
            exit_like(status)


def exit_like(status: int) -> None:
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


def status_of(pid: int) -> int:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return status
        except ChildProcessError:
            return 0


def run_as_root(job: dict) -> None:
    try:
        for joined in job["cgroups"]:  # before anything forks: every process of the run is in
            with open(joined, "w") as handle:
                handle.write("0")  # this (single-threaded) process: see cgroups.join_files
        libc = Libc()
        build_root(libc, job["uid"], job["tmp_mb"])
        init = os.fork()
    except BaseException as error:
        fail(repr(error))
    if init == 0:
        try:
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # die with the launcher
            libc.mount("proc", ROOT + "/proc", "proc", NOSUID | NODEV | NOEXEC)
            os.chroot(ROOT)
            os.chdir("/tmp/work")
            os.environ.clear()
            os.environ.update(job["env"])
        except BaseException as error:
            fail(repr(error))
        supervise(job, libc)  # init leaving ends the namespace: everything in it dies

    def give_up(*_) -> None:
        os.kill(init, signal.SIGKILL)
        os._exit(124)

    signal.signal(signal.SIGALRM, give_up)
    signal.alarm(job["limits"]["RLIMIT_CPU"] + 2)
    exit_like(status_of(init))


def run_inside(job: dict) -> None:
    try:
        os.chdir("/tmp/work")
        os.environ.clear()
        os.environ.update(job["env"])
        libc = Libc()  # bwrap has set no_new_privs and dropped every capability
    except BaseException as error:
        fail(repr(error))
    supervise(job, libc)


def main() -> None:
    job = marshal.loads(sys.stdin.buffer.read())
    if job["mode"] == "root":
        run_as_root(job)
    else:
        run_inside(job)


if __name__ == "__main__":
    main()
