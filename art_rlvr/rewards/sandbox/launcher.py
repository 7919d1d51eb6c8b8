"""The process that runs one sandboxed job: `python -S -s -P launcher.py < marshalled job`.

It is started by path, not imported: it runs with no site-packages, as root on the host or
inside bubblewrap, so it uses the standard library only. Its job's "mode" says which:

- "root": build mount/PID/network/IPC/UTS namespaces and a read-only chroot, fork an init
  (whose exit ends the namespace) and a worker that drops to a throwaway uid;
- "inside": bubblewrap has built the namespaces and the root already and runs this as an
  unprivileged user; set the limits and run the harness in this process.

The harness compiles the program, the tests and each test unit and reports each result as a
line `<nonce> {dict}` on a copy of stdout. Exit codes: the worker's (0 = the harness finished),
128 + signal when it was killed, 125 when setup failed.
"""

import marshal
import os
import resource
import signal
import sys

SETUP_FAILED = 125
ROOT = "/tmp"  # the new root is built here, inside a private mount namespace
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38


def fail(message: str) -> None:
    os.write(2, ("sandbox setup failed: " + message + "\n").encode())
    os._exit(SETUP_FAILED)


class Libc:
    """mount(2) and prctl(2), which os lacks. Only the root path loads it: importing ctypes
    costs 5-30 ms a run, and inside bubblewrap (which sets no_new_privs) nothing needs it."""

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
        self.lib.prctl(option, value, 0, 0, 0)


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


def limit(limits: dict[str, int]) -> None:
    """stdin from /dev/null, and the resource limits."""
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for name, value in limits.items():
        hard = value + 1 if name == "RLIMIT_CPU" else value  # SIGXCPU first, then SIGKILL
        resource.setrlimit(getattr(resource, name), (value, hard))


def status_of(pid: int) -> int:
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            return status
        except ChildProcessError:
            return 0


def exit_like(status: int) -> None:
    if os.WIFSIGNALED(status):
        os._exit(128 + os.WTERMSIG(status))
    os._exit(os.WEXITSTATUS(status))


def last_line(error: BaseException) -> str:
    try:
        text = str(error)
    except BaseException:
        text = "(unprintable)"
    name = type(error).__name__
    return (name + ": " + text if text else name)[:300]


def harness(job: dict) -> None:
    """Run the program, the tests' source and each unit in one namespace; report each step."""
    import builtins

    report_fd = os.dup(1)
    nonce = job["nonce"]

    def report(kind: str, **fields) -> None:
        fields["kind"] = kind
        line = f"\n{nonce} {fields!r}\n"
        os.write(report_fd, line.encode("utf-8", "backslashreplace"))

    def finish() -> None:
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
            report("missing_function", error=f"no function named {entry!r}")
            finish()
        space["candidate"] = space[entry]
    for index, unit in enumerate(job["units"]):
        try:
            exec(compile(unit, f"test_{index}", "exec"), space)
        except AssertionError as error:
            report("unit", index=index, ok=False, error=last_line(error))
        except BaseException as error:
            kind = "memory" if isinstance(error, MemoryError) else "error"
            report("unit", index=index, ok=False, error=last_line(error), failure=kind)
        else:
            report("unit", index=index, ok=True)
    report("done")
    finish()


def run_as_root(job: dict) -> None:
    uid = job["uid"]
    try:
        libc = Libc()
        build_root(libc, uid, job["tmp_mb"])
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
            worker = os.fork()
        except BaseException as error:
            fail(repr(error))
        if worker == 0:
            try:
                limit(job["limits"])
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                libc.prctl(PR_SET_NO_NEW_PRIVS, 1)
            except BaseException as error:
                fail(repr(error))
            harness(job)
        exit_like(status_of(worker))  # init leaving ends the namespace: everything in it dies

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
        limit(job["limits"])  # bwrap has set no_new_privs and dropped every capability
    except BaseException as error:
        fail(repr(error))
    harness(job)


def main() -> None:
    job = marshal.loads(sys.stdin.buffer.read())
    if job["mode"] == "root":
        run_as_root(job)
    else:
        run_inside(job)


if __name__ == "__main__":
    main()
