"""Load: 256 concurrent rollouts against TorchBackend, with no errors and bounded memory."""

from __future__ import annotations

import asyncio
from pathlib import Path

from art_rlvr import SamplingConfig, rollout

CONCURRENT = 256
MAX_EXTRA_MB = 1500  # the base model and one adapter are ~1 GB; 256 short rows add far less


def rss_mb() -> float:
    """Resident memory now (VmRSS), not the lifetime peak: earlier tests trained in this process."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


async def test_256_concurrent_rollouts_finish_without_errors_in_bounded_memory(
    model, scenario
) -> None:
    examples = scenario.splits["train"][:CONCURRENT]
    assert len(examples) == CONCURRENT
    baseline, peak, done = rss_mb(), 0.0, asyncio.Event()

    async def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_mb())
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch())
    sampling = SamplingConfig(max_tokens=8, temperature=1.0, seed=0)
    results = await asyncio.gather(
        *[rollout(model, sc, sampling=sampling) for sc in examples], return_exceptions=True
    )
    done.set()
    await watcher
    errors = [r for r in results if isinstance(r, BaseException)]
    assert errors == []
    assert {t.metadata["scenario_id"] for t in results} == {s.id for s in examples}
    assert all(0 < t.metrics["completion_tokens"] <= 8 for t in results)
    print(f"{CONCURRENT} concurrent rollouts: RSS {baseline:.0f} MB -> peak {peak:.0f} MB")
    assert peak - baseline < MAX_EXTRA_MB
