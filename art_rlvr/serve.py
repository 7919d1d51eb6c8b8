"""`python -m art_rlvr.serve runs/<run> [--step N] [--port P]`: a run's model as an
OpenAI-compatible endpoint on 127.0.0.1, for other tools (an eval harness, a chat UI, a script).

It is TorchBackend's own server, with the chosen checkpoint's adapter on the run's base model,
so it answers as the run's evaluations were answered at that step (the default step is the
best val one, as for `art_rlvr.export`). The run folder is only read: the checkpoint is linked
into a temporary ART folder, where the backend resumes at that step. Ctrl-C (or SIGTERM) stops
it: in-flight requests finish, the engine stops, the temporary folder goes.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

os.environ.setdefault("WEAVE_DISABLED", "true")  # `import art` may load weave
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from art_rlvr.core.art_layout import checkpoint_dir
from art_rlvr.core.text import first_line
from art_rlvr.export import Checkpoint, ExportError, find_checkpoint

if TYPE_CHECKING:
    from art_rlvr.backend import TorchBackend

KEY_ENV = "ART_RLVR_SERVE_KEY"
HOST = "127.0.0.1"  # loopback only, always


def stage(checkpoint: Checkpoint, art_path: Path) -> None:
    """An ART folder whose only checkpoint is a link to the chosen one: the backend resumes at
    that step (so the bare model name means it too) and writes nothing into the run."""
    model_dir = art_path / checkpoint.project / "models" / checkpoint.name
    link = checkpoint_dir(model_dir, checkpoint.step)
    link.parent.mkdir(parents=True)
    link.symlink_to(checkpoint.folder.resolve(), target_is_directory=True)


async def load(checkpoint: Checkpoint, art_path: Path) -> TorchBackend:
    """A TorchBackend holding the checkpoint, with the LoRA shape the checkpoint was saved in."""
    from art_rlvr.backend import BackendChoice, LoraSettings, TorchBackend

    adapter = checkpoint.adapter_config()
    modules = adapter["target_modules"]
    lora = LoraSettings(
        rank=adapter["r"],
        alpha=adapter["lora_alpha"],
        dropout=adapter.get("lora_dropout") or 0.0,
        target_modules=(modules,) if isinstance(modules, str) else tuple(sorted(modules)),
    )
    backend = TorchBackend(path=art_path, lora=lora)
    choice = BackendChoice(
        name="torch", base_model=checkpoint.base_model, chat_template=checkpoint.chat_template
    )
    model = choice.trainable_model(checkpoint.name, checkpoint.project)
    await backend.register(model)  # the backend's own server is not started: we bind ours
    return backend


def listen(port: int) -> socket.socket:
    """A listening loopback socket (0: a free port); requests made while the model loads wait
    in its backlog."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
    except OSError as error:
        sock.close()
        raise ExportError(f"cannot listen on {HOST}:{port}: {error.strerror}") from None
    sock.listen(128)
    return sock


def banner(checkpoint: Checkpoint, base_url: str, key: str, key_from_env: bool) -> list[str]:
    acc = checkpoint.val_accuracy
    scored = f", val accuracy {acc:.3f}" if acc is not None else ""
    key_line = (
        f"(from ${KEY_ENV})"
        if key_from_env
        else f"{key}  (new each start; set ${KEY_ENV} to fix it)"
    )
    lines = [
        f"serving {checkpoint.run} step {checkpoint.step} ({checkpoint.reason}{scored})",
        f"  base URL  {base_url}",
        f"  model     {checkpoint.name}  (or {checkpoint.name}@{checkpoint.step})",
        f"  API key   {key_line}",
        f"  e.g.      OPENAI_BASE_URL={base_url} OPENAI_API_KEY=<key> your-tool",
    ]
    if checkpoint.system_prompt:
        lines.append(
            f"  scored with system prompt: {' '.join(checkpoint.system_prompt.split())[:200]}"
        )
    return [*lines, "Ctrl-C stops it."]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m art_rlvr.serve",
        description="Serve a run's model on 127.0.0.1 as an OpenAI-compatible endpoint.",
    )
    parser.add_argument("run", type=Path, help="the run folder, e.g. runs/arith-rl-s0")
    parser.add_argument("--step", type=int, help="the checkpoint step (default: best val)")
    parser.add_argument("--port", type=int, default=8000, help="port on 127.0.0.1 (0: any free)")
    return parser


def main(argv: list[str] | None = None) -> int:
    from art_rlvr.backend import TorchBackend

    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        checkpoint = find_checkpoint(args.run, args.step)
        sock = listen(args.port)
    except ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    key_from_env = bool(os.environ.get(KEY_ENV))
    key = os.environ.get(KEY_ENV) or TorchBackend.new_api_key()
    base_url = f"http://{HOST}:{sock.getsockname()[1]}/v1"
    previous = signal.signal(signal.SIGTERM, signal.default_int_handler)  # SIGTERM stops cleanly
    try:
        with tempfile.TemporaryDirectory(prefix="art-rlvr-serve-") as tmp:
            stage(checkpoint, Path(tmp))
            try:
                backend = asyncio.run(load(checkpoint, Path(tmp)))
            except (OSError, ValueError) as error:  # the base model or adapter would not load
                print(
                    f"error: cannot load base model {checkpoint.base_model!r}: {first_line(error)}",
                    file=sys.stderr,
                )
                return 2
            print("\n".join(banner(checkpoint, base_url, key, key_from_env)), flush=True)
            # returns on Ctrl-C after a graceful shutdown of at most a few seconds
            backend.serve_on(sock, key)
    except KeyboardInterrupt:  # uvicorn re-raises the signal it handled; or one came while loading
        pass
    finally:
        sock.close()
        signal.signal(signal.SIGTERM, previous)
    print("stopped", flush=True)
    return 0


def exit_now(status: int) -> None:
    """Exit without the interpreter's teardown: its last collection walks every object torch
    and transformers made (3 s idle, 10-45 s on a loaded machine after serving), and nothing
    is left that needs it once the backend is closed. Logs and output are flushed first."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_now(main())
