"""Threads: OpenMP spinning (`import art_rlvr` shortens it unless the user chose), and the
engine's own thread count (chosen by timing its steps; results do not depend on it)."""

import asyncio
import os
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import art
import pytest
import torch
from conftest import engine_on, new_model
from cores import worker_threads

from art_rlvr import SamplingConfig, TorchBackend, gather_groups, rollout
from art_rlvr.backend.engine.generation import EngineClosed, SamplingParams
from art_rlvr.backend.runtime.threads import ThreadTuner, usable_cores
from art_rlvr.backend.training import steps as S

CORES = len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    ("name", "given", "seen"),
    [
        ("GOMP_SPINCOUNT", None, "30000"),
        ("GOMP_SPINCOUNT", "300000", "300000"),
        ("GOMP_SPINCOUNT", "0", "0"),
        ("MKL_CBWR", None, "AUTO,STRICT"),
        ("MKL_CBWR", "AVX2", "AVX2"),
    ],
)
def test_openmp_and_mkl_settings_have_defaults_and_keep_the_users(name, given, seen) -> None:
    env = {k: v for k, v in os.environ.items() if k != name}
    if given is not None:
        env[name] = given
    code = f"import os, art_rlvr; print(os.environ[{name!r}])"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == seen


# ------------------------------------------------------------------ the engine's thread count


def feed(tuner: ThreadTuner, seconds: dict[int, float], steps: int, rows: int = 8) -> list[int]:
    """Run `steps` decode steps whose time depends only on the thread count; the counts used."""
    used = []
    for _ in range(steps):
        threads = tuner.threads_for_next_step()
        tuner.record(threads, rows, seconds[threads])
        used.append(threads)
    return used


def test_the_tuner_moves_to_one_thread_when_it_is_faster_and_back() -> None:
    tuner = ThreadTuner(2)
    assert feed(tuner, {1: 1.0, 2: 0.6}, 200).count(1) < 200 // 6  # two threads win: stay
    assert tuner.current == 2 and tuner.switches == 0
    feed(tuner, {1: 1.0, 2: 3.0}, 100)  # a competitor arrives: two threads now take 3x
    assert tuner.current == 1
    used = feed(tuner, {1: 1.0, 2: 3.0}, 240)
    assert used.count(2) <= 2 * (240 // 24) + 2  # exploring the slow count: 2 steps in 24
    feed(tuner, {1: 1.0, 2: 0.6}, 200)  # it leaves
    assert tuner.current == 2


def test_the_switchs_own_step_is_not_compared_so_two_threads_come_back() -> None:
    """The first step after switching to two threads pays for waking the second (here 1.2 s,
    slower than one thread's 1.0 s); the steps after it take 0.6 s. Timed against that first
    step, two threads never look faster, and a tuner that once moved to one thread (a
    competitor came and went) would stay there, as it did on an idle machine (18 % slower)."""
    tuner = ThreadTuner(2)
    feed(tuner, {1: 1.0, 2: 3.0}, 100)  # a competitor: one thread is faster
    assert tuner.current == 1
    used = [1]
    for _ in range(400):  # it has left
        threads = tuner.threads_for_next_step()
        woken = threads == 2 and used[-1] == 1
        tuner.record(threads, 8, 1.2 if woken else {1: 1.0, 2: 0.6}[threads])
        used.append(threads)
    assert tuner.current == 2
    assert used[-200:].count(1) <= 2 * (200 // 24) + 2


def test_one_slow_step_does_not_switch() -> None:
    tuner = ThreadTuner(2)
    feed(tuner, {1: 1.0, 2: 0.6}, 7)
    tuner.record(2, 8, 5.0)  # a step the OS descheduled
    assert feed(tuner, {1: 1.0, 2: 0.6}, 200).count(1) < 200 // 6
    assert tuner.current == 2 and tuner.switches == 0


def test_the_tuner_compares_only_steps_of_the_same_rows_and_a_fixed_count_stays() -> None:
    tuner = ThreadTuner(2)
    for _ in range(300):  # the other count always lands on a batch half the size
        threads = tuner.threads_for_next_step()
        rows = 4 if threads == tuner.other else 8
        tuner.record(threads, rows, 0.1 * rows)
    assert tuner.current == 2 and tuner.switches == 0
    fixed = ThreadTuner(2, fixed=True)
    assert set(feed(fixed, {1: 0.1, 2: 9.0}, 100)) == {2}


def test_usable_cores_follow_the_affinity_mask_and_torch() -> None:
    assert 1 <= usable_cores() <= min(len(os.sched_getaffinity(0)), torch.get_num_threads())


async def test_the_engine_samples_the_same_at_one_and_two_threads(
    backend, model, make_engine
) -> None:
    """Seeded rows (batched, invariant path) give bit-identical tokens and logprobs whatever
    the engine thread's count: the tuner may switch at any step without changing a result."""
    base = next(iter(backend._bases.values()))
    prompts = [base.tokenizer(f"Count to {i}:")["input_ids"] for i in range(3, 9)]
    results = []
    for threads in (1, 2):
        engine = make_engine(threads=threads)
        try:
            done = await asyncio.gather(
                *[
                    engine.generate(p, SamplingParams(max_tokens=12, seed=i), n=2, adapter=None)
                    for i, p in enumerate(prompts)
                ]
            )
        finally:
            engine.close()
        results.append([(c.token_ids, c.logprobs) for cs in done for c in cs])
    assert results[0] == results[1]


async def test_the_tuner_times_only_steps_that_ran_the_model(backend, model, make_engine) -> None:
    """The step that retires a batch's last rows runs no forward and takes a tenth of a step:
    compared as a step at the other count, it once made that count look ten times faster."""
    base = next(iter(backend._bases.values()))
    engine = make_engine(threads=1)
    timed: list[int] = []
    record = engine.tuner.record
    engine.tuner.record = lambda threads, rows, seconds: (  # type: ignore[method-assign]
        timed.append(rows),
        record(threads, rows, seconds),
    )
    prompts = [base.tokenizer(f"Count to {i}:")["input_ids"] for i in range(3, 6)]
    params = SamplingParams(max_tokens=4, seed=0, ignore_eos=True)
    try:
        await asyncio.gather(*[engine.generate(p, params, n=2, adapter=None) for p in prompts])
    finally:
        engine.close()
    assert timed == [6, 6, 6]  # 4 tokens: 3 forwards after the prefill's, then retirement


@pytest.mark.parametrize(("differs", "fixed"), [(False, False), (True, True)])
def test_the_tuner_keeps_one_count_where_counts_change_results(differs, fixed) -> None:
    def logits() -> torch.Tensor:  # what a forward gives; here it depends on the count or not
        return torch.tensor([float(torch.get_num_threads()) if differs else 1.0])

    tuner = ThreadTuner(2)
    tuner.verify(logits)
    assert tuner.fixed is fixed and tuner.current == 2
    if fixed:
        assert set(feed(tuner, {1: 0.1, 2: 9.0}, 50)) == {2}


@pytest.fixture(scope="module")
async def two_threads(tmp_path_factory):
    """A backend of 2 threads, whatever the process's count (a pytest-xdist worker runs at its
    share of the cores: tests/conftest.py)."""
    backend = TorchBackend(path=tmp_path_factory.mktemp("two_threads"), seed=0, threads=2)
    yield backend
    await backend.close()


@pytest.mark.parametrize("threads", [0, -1, True, 1.5])
def test_a_thread_count_below_one_or_not_whole_is_refused(tmp_path, threads) -> None:
    with pytest.raises(ValueError, match="threads must be a whole number >= 1"):
        TorchBackend(path=tmp_path, threads=threads)


async def test_training_runs_at_the_backends_count_not_the_one_the_engine_set_last(
    two_threads, monkeypatch
) -> None:
    """torch gives a thread that has not used it yet the count set last by any thread: an
    engine at 1 thread must not make a fresh pool thread train at 1."""
    backend = two_threads
    model = await new_model(backend, "threads")
    engine = engine_on(backend, threads=1)
    process_count = torch.get_num_threads()
    seen: list[int] = []
    sft_step = S.sft_step

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return sft_step(*args, **kwargs)

    monkeypatch.setattr(S, "sft_step", spy)
    loop = asyncio.get_running_loop()
    try:
        await engine.generate([1, 2, 3], SamplingParams(max_tokens=1), adapter=None)
        loop.set_default_executor(ThreadPoolExecutor())  # threads torch has not seen yet
        assert await loop.run_in_executor(None, torch.get_num_threads) == 1  # the hazard
        data = [
            art.Trajectory(
                messages_and_choices=[
                    {"role": "user", "content": "Say yes."},
                    {"role": "assistant", "content": "Yes."},
                ]
            )
        ] * 2
        config = art.TrainSFTConfig(learning_rate=1e-5, batch_size=2)
        async for _ in backend._train_sft(model, data, config):
            pass
    finally:
        engine.close()
        torch.set_num_threads(process_count)  # torch's default for later threads
    assert seen == [2]


# ------------------------------------------------------------------ one torch thread


async def test_training_and_saving_run_on_the_engine_thread_with_gradients(
    two_threads, scenario
) -> None:
    """libgomp cuts every wait's spinning to 100 while the process holds more OpenMP workers
    than cores, and each thread that runs torch at more than one thread keeps its own pool: a
    training step on a second thread beside the engine's took 1.4x its time. Every forward of
    a run samples on the engine's thread; a training step's microbatches run there or on
    threads of one intra-op thread each (no pool), which end with the step. The step's
    checkpoint is still written."""
    backend = two_threads
    model = await new_model(backend, "onethread")
    trainee = backend._trainees[model.name]
    groups = await gather_groups(
        model, scenario.splits["train"][:2], 4, sampling=SamplingConfig(max_tokens=8), seed=1
    )
    for group in groups:
        for i, trajectory in enumerate(group.trajectories):
            trajectory.reward = float(i % 2)
    forwards: list[tuple[str, bool, int]] = []
    hook = trainee.base.model.register_forward_pre_hook(
        lambda *_: forwards.append(
            (threading.current_thread().name, torch.is_grad_enabled(), torch.get_num_threads())
        )
    )
    saved: list[str] = []
    watched = ckpt_dir(trainee)
    try:
        result = await backend.train(model, groups, learning_rate=1e-4)
        chunk_threads = [t for t in threading.enumerate() if t.name.startswith("art-rlvr-chunk")]
        saved = sorted(p.name for p in watched.iterdir())
        await rollout(model, scenario.splits["val"][0], sampling=SamplingConfig(max_tokens=4))
    finally:
        hook.remove()
    assert result.step == 1 and saved == ["0000", "0001"] and chunk_threads == []
    sampling = [f for f in forwards if not f[1]]
    training = [f for f in forwards if f[1]]
    assert {name for name, *_ in sampling} == {"art-rlvr-engine"}
    assert training and all(
        name == "art-rlvr-engine" or (name.startswith("art-rlvr-chunk") and threads == 1)
        for name, _, threads in training
    )
    assert {name for name, *_ in training} != {"art-rlvr-engine"}  # microbatches, 2 at once
    assert not forwards[-1][1]  # trained, then sampled


def ckpt_dir(trainee) -> Path:
    return trainee.model_dir / "checkpoints"


async def test_a_job_waits_for_the_running_batch_and_holds_back_new_rows(
    backend, model, make_engine
) -> None:
    base = next(iter(backend._bases.values()))
    engine = make_engine(threads=1)
    params = SamplingParams(max_tokens=6, seed=0, ignore_eos=True)
    events: list[str] = []

    async def sample(name: str) -> None:
        await engine.generate([1, 2, 3], params, adapter=None)
        events.append(name)

    def job() -> str:
        events.append("job")
        return threading.current_thread().name

    try:
        first = asyncio.create_task(sample("first"))
        while engine.stats.running_rows == 0:  # the first request is decoding
            await asyncio.sleep(0.001)
        ran_on = asyncio.create_task(engine.run(job))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(sample("second"))  # arrives while the job waits
        assert await ran_on == "art-rlvr-engine"
        await asyncio.gather(first, second)
    finally:
        engine.close()
    assert events == ["first", "job", "second"]
    assert base.lock.acquire(blocking=False)  # the job gave the model back
    base.lock.release()


async def test_a_failing_job_raises_for_its_caller_and_the_engine_serves_on(
    backend, model, make_engine
) -> None:
    engine = make_engine(threads=1)

    def broken() -> None:
        raise ValueError("bad batch")

    try:
        with pytest.raises(ValueError, match="bad batch"):
            await engine.run(broken)
        assert await engine.run(torch.is_grad_enabled) is True
        done = await engine.generate([1, 2, 3], SamplingParams(max_tokens=2), adapter=None)
    finally:
        engine.close()
    assert len(done[0].token_ids) == 2
    with pytest.raises(EngineClosed):
        await engine.run(torch.is_grad_enabled)


async def test_a_job_cancelled_before_it_starts_is_skipped(backend, model, make_engine) -> None:
    engine = make_engine(threads=1)
    release = threading.Event()
    ran: list[str] = []
    try:
        blocker = asyncio.create_task(engine.run(release.wait, 30))
        await asyncio.sleep(0.05)  # the blocker runs; the next job waits in the queue
        skipped = asyncio.create_task(engine.run(ran.append, "skipped"))
        await asyncio.sleep(0.05)
        skipped.cancel()
        with pytest.raises(asyncio.CancelledError):
            await skipped
        release.set()
        await blocker
        await engine.run(ran.append, "after")
    finally:
        engine.close()
    assert ran == ["after"]


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, {}),  # not under pytest-xdist
        ({"PYTEST_XDIST_WORKER_COUNT": "1"}, {}),
        ({"PYTEST_XDIST_WORKER_COUNT": "2"}, {"OMP_NUM_THREADS": str(max(1, CORES // 2))}),
        ({"PYTEST_XDIST_WORKER_COUNT": str(CORES * 4)}, {"OMP_NUM_THREADS": "1"}),
        ({"PYTEST_XDIST_WORKER_COUNT": "2", "OMP_NUM_THREADS": "3"}, {}),  # the user's count
    ],
)
def test_each_xdist_worker_gets_its_share_of_the_cores(environ, expected) -> None:
    assert worker_threads(environ) == expected


def test_this_workers_backend_runs_at_its_share(backend) -> None:
    """The share reaches torch: conftest sets it before torch loads."""
    if os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") == "1":
        pytest.skip("not a pytest-xdist worker")
    assert backend.threads == int(os.environ["OMP_NUM_THREADS"])
