"""Run a module (or `-c CODE`) with every network lookup or connection that is not loopback
refused before it happens and recorded in LOG, one line each.

    python loopback_only.py LOG -m MODULE [ARGS...]
    python loopback_only.py LOG -c CODE

An audit hook sees `socket.getaddrinfo` and `socket.connect` in every thread, atexit
handlers included, so a library that phones home at exit is caught too.
"""

import ipaddress
import runpy
import sys
from pathlib import Path


def is_loopback(host: object) -> bool:
    if host is None:  # getaddrinfo(None, port): the local machine
        return True
    name = host.decode() if isinstance(host, bytes) else str(host)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name.split("%")[0]).is_loopback
    except ValueError:
        return False


def main() -> None:
    log, flag, target, *args = sys.argv[1:]
    log_path = Path(log)

    def hook(event: str, hook_args: tuple) -> None:
        if event == "socket.getaddrinfo":
            host = hook_args[0]
        elif event == "socket.connect" and isinstance(hook_args[1], tuple):
            host = hook_args[1][0]
        else:
            return
        if not is_loopback(host):
            with log_path.open("a") as f:
                f.write(f"{event} {host}\n")
            raise ConnectionRefusedError(f"blocked: {host} is not loopback")

    sys.addaudithook(hook)
    if flag == "-c":
        exec(compile(target, "<loopback_only -c>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = [target, *args]
        runpy.run_module(target, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
