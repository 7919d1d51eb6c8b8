"""The embedded model's weights served by a real vLLM (its CPU build, in a venv of its own) as
an external policy: `mode=eval` through `policy.*` beside TorchBackend's own greedy eval of the
same weights, then GEPA with the policy, and the reflection LM, on that vLLM server.

    python benchmarks/vllm_endpoint.py --vllm-python /path/to/vllm-venv/bin/python

(docs/scaling.md, "An external vLLM endpoint", has the venv recipe). It prints one table:
val accuracy on each engine, the items where the greedy completions differ, and the GEPA
run's calls; the run folders stay under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
SERVED = "smollm2-135m"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_vllm(python: str, folder: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    """vLLM's OpenAI server on loopback, fp32 like TorchBackend on CPU, the folder's own chat
    template (SmolLM2's), greedy by request."""
    command = [
        python, "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
        "--served-model-name", SERVED, "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--max-model-len", "2048", "--seed", "0",
    ]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "2"}
    env.pop("VIRTUAL_ENV", None)
    with log.open("ab") as out:
        return subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def wait_up(process: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if process.poll() is not None:
            raise SystemExit(f"vLLM exited with {process.returncode}; log {log}")
        try:
            if httpx.get(f"{url}/models", timeout=5).status_code == 200:
                return time.monotonic() - started
        except httpx.HTTPError:
            pass
        time.sleep(5)
    raise SystemExit(f"vLLM not up after {timeout_s:.0f} s; log {log}")


def cli(words: list[str], **env: str) -> float:
    started = time.monotonic()
    subprocess.run(
        [sys.executable, "-m", "art_rlvr.run", *words], check=True, env={**os.environ, **env}
    )
    return time.monotonic() - started


def val_rows(run_dir: Path) -> dict[str, tuple[str, bool]]:
    """Each val item's greedy completion and whether it was correct."""
    from art_rlvr.rundir.stored import read_trajectories

    (path,) = sorted((run_dir / "trajectories").glob("val_*.jsonl"))[:1]
    out: dict[str, tuple[str, bool]] = {}
    for trajectory in read_trajectories(path):
        last = trajectory.messages_and_choices[-1]
        text = (last.get("message") or last).get("content") or ""
        out[str(trajectory.metadata.get("scenario_id"))] = (
            text,
            bool(trajectory.metrics.get("correct")),
        )
    return out


def main() -> int:
    from art_rlvr.backend.adapters.model_source import DEFAULT_BASE_MODEL, resolve_base_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--vllm-python",
        default=os.environ.get("VLLM_PYTHON"),
        required="VLLM_PYTHON" not in os.environ,
    )
    parser.add_argument("--scenario", default="arith")
    parser.add_argument("--val-limit", type=int, default=100)
    parser.add_argument("--gepa-calls", type=int, default=80)
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "results" / "vllm_endpoint"
    )
    parser.add_argument("--start-timeout-s", type=float, default=2400)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    folder = resolve_base_model(DEFAULT_BASE_MODEL)
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    log = args.out / "vllm.log"
    process = start_vllm(args.vllm_python, folder, port, log)
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    try:
        results["vllm_start_s"] = round(wait_up(process, url, log, args.start_timeout_s), 1)
        common = [
            f"scenario={args.scenario}",
            "mode=eval",
            f"val_limit={args.val_limit}",
            "eval_test=false",
        ]
        policy = [
            f"policy.model=openai/{SERVED}",
            f"policy.api_base={url}",
            "policy.api_key_env=VLLM_KEY",
        ]
        torch_dir, vllm_dir = args.out / "eval-torch", args.out / "eval-vllm"
        results["torch_eval_s"] = round(cli([*common, f"run_dir={torch_dir}", "resume=false"]), 1)
        results["vllm_eval_s"] = round(
            cli([*common, *policy, f"run_dir={vllm_dir}", "resume=false"], VLLM_KEY="none"), 1
        )
        ours, theirs = val_rows(torch_dir), val_rows(vllm_dir)
        shared = sorted(set(ours) & set(theirs))
        results["items"] = len(shared)
        results["torch_accuracy"] = sum(ours[i][1] for i in shared) / len(shared)
        results["vllm_accuracy"] = sum(theirs[i][1] for i in shared) / len(shared)
        results["same_completion"] = sum(ours[i][0] == theirs[i][0] for i in shared)
        results["same_outcome"] = sum(ours[i][1] == theirs[i][1] for i in shared)
        gepa_dir = args.out / "gepa-vllm"
        gepa = [
            f"scenario={args.scenario}", "mode=gepa", f"run_dir={gepa_dir}", "resume=false", *policy,
            f"reflection.model=openai/{SERVED}", f"reflection.api_base={url}", "reflection.api_key_env=VLLM_KEY",
            f"max_metric_calls={args.gepa_calls}", "val_limit=20", "max_tokens=16",
        ]  # fmt: skip
        results["gepa_s"] = round(cli(gepa, VLLM_KEY="none"), 1)
        summary = json.loads((gepa_dir / "summary.json").read_text())
        results["gepa"] = {
            k: summary.get(k)
            for k in (
                "val_accuracy_before",
                "val_accuracy_after",
                "reflection_calls",
                "reflection_errors",
                "prompt_changes",
            )
        }
    finally:
        os.killpg(process.pid, 15)
        process.wait(timeout=60)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
