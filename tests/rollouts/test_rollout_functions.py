"""A user's ART rollout function as a scenario (`[rollout] function = "..."`).

Load-time errors name the scenario file and line; every way a function goes wrong at run time
scores that episode 0 with its reason counted; a batch where every rollout failed is an error,
never a 0.0. The good functions run for real: against the embedded model on loopback, and
through the CLI against a scripted OpenAI-compatible server.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import art
import pytest
from openai.types.chat.chat_completion import Choice

from art_rlvr.core.outcome import turns
from art_rlvr.ei.hints import hinted_system
from art_rlvr.eval.evaluate import evaluate
from art_rlvr.eval.journal import JournalRow
from art_rlvr.rollouts.functions import RolloutContext, rollout_failure, trainable
from art_rlvr.rollouts.rollout import gather_groups, rollout
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.rundir.events import RolloutsFailed
from art_rlvr.rundir.stored import read_trajectories, stored_trajectory
from art_rlvr.scenarios.scenario import load_scenario, rollout_scenario
from art_rlvr.scenarios.sources import ScenarioFileError
from art_rlvr.testing.scripted_server import ScriptedServer, Step

CASES = Path(__file__).parents[1] / "scripts" / "rollout_cases.py"
SOURCE = {"type": "arith", "ops": ["+"], "min_value": 1, "max_value": 9,
          "splits": {"train": 6, "val": 3, "test": 2}}  # fmt: skip


def scenario_file(
    folder: Path,
    function: str,
    *,
    extra: str = "",
    timeout_s: float = 5,
    rollout: str = "",
    system_prompt: str | None = "Reply with only the number.",
) -> Path:
    path = folder / "mine.toml"
    path.write_text(
        'name = "mine"\n'
        + (f'system_prompt = "{system_prompt}"\n' if system_prompt is not None else "\n")
        + f"{extra}"
        "[source]\n"
        'type = "arith"\nops = ["+"]\nmin_value = 1\nmax_value = 9\n'
        "splits = { train = 6, val = 3, test = 2 }\n"
        "\n[rollout]\n"
        f'function = "{function}"\n'
        f"timeout_s = {timeout_s}\n"
        f"{rollout}"
    )
    return path


def case(name: str) -> str:
    return f"{CASES}:{name}"


LOAD_ERRORS = [
    ("no_such_module_xyz:rollout", "cannot import module 'no_such_module_xyz'"),
    ("missing_file.py:rollout", "no file"),
    ("nocolon", "must look like 'module:function'"),
    (case("missing"), "has no attribute 'missing'"),
    (case("not_async"), "is not an async function"),
    (case("one_param"), "must accept (model, record) or (model, record, context)"),
    (case("four_params"), "takes 4 required positional parameter(s)"),
    (
        case("step_and_validation"),
        "takes (model, step, is_validation): art_rlvr calls a rollout as (model, record) or "
        "(model, record, context), and its third parameter 'is_validation' is not a context",
    ),
    (case("NOT_A_FUNCTION"), "is a int, not a function"),
    (f"{CASES.parent / 'rollout_broken.py'}:rollout", "raised RuntimeError: broken at import"),
]


@pytest.mark.parametrize(("function", "message"), LOAD_ERRORS)
def test_a_bad_function_is_a_load_time_error_at_its_line(
    tmp_path: Path, function: str, message: str
) -> None:
    path = scenario_file(tmp_path, function)
    with pytest.raises(ScenarioFileError) as error:
        load_scenario(str(path))
    assert f"{path}:11:" in str(error.value)  # the `function = ...` line
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("extra", "key", "line"),
    [
        ('user_template = "What is {a}?"\n', "user_template", 3),
        ('[reward]\nname = "numeric"\n\n', "reward", 4),
    ],
)
def test_a_rollout_scenario_that_also_renders_or_scores_is_refused(
    tmp_path: Path, extra: str, key: str, line: int
) -> None:
    path = scenario_file(tmp_path, case("always_right"), extra=extra)
    with pytest.raises(ScenarioFileError, match=rf"mine\.toml:{line}: '{key}' cannot be used"):
        load_scenario(str(path))


def test_a_module_beside_the_scenario_file_is_found(tmp_path: Path) -> None:
    (tmp_path / "agent_beside_xyz.py").write_text(
        "import art\n\nasync def rollout(model, record):\n    return art.Trajectory(reward=1.0)\n"
    )
    task = load_scenario(str(scenario_file(tmp_path, "agent_beside_xyz:rollout")))
    assert task.rollout_fn is not None and not task.rollout_fn.takes_context
    assert [len(task.splits[s]) for s in ("train", "val", "test")] == [6, 3, 2]
    assert task.splits["val"][0].messages() == [
        {"role": "system", "content": "Reply with only the number."}
    ]


def offline_model() -> art.Model:
    """A model no faulty function ever calls (so no server is needed)."""
    return art.Model(name="offline", project="tests", inference_base_url="http://127.0.0.1:9/v1")


FAULTS = [
    ("raises", "raised RuntimeError: agent crashed on"),
    ("hangs", "timed out after 0.5 s"),
    ("own_timeout", "raised TimeoutError"),
    ("no_reward", "reward was never set"),
    ("nan_reward", "returned a non-finite reward (nan); ART trains finite rewards only"),
    ("inf_reward", "returned a non-finite reward (inf); ART trains finite rewards only"),
    ("returns_float", "returned float, not an art.Trajectory"),
    ("returns_none", "returned NoneType, not an art.Trajectory"),
]


@pytest.mark.parametrize(("name", "reason"), FAULTS)
async def test_a_failing_function_scores_zero_with_its_reason(
    tmp_path: Path, name: str, reason: str
) -> None:
    task = load_scenario(str(scenario_file(tmp_path, case(name), timeout_s=0.5)))
    scenario = task.splits["val"][0]
    t = await rollout(offline_model(), scenario)
    assert t.reward == 0.0 and t.metrics["rollout_error"] == 1.0 and t.metrics["correct"] == 0.0
    assert reason in (rollout_failure(t) or "")
    assert any(reason in line for line in t.logs)
    assert t.metadata["scenario_id"] == scenario.id and reason in t.metadata["feedback"]


REWARDS = [  # (function, [rollout] lines, the reward trained, correct)
    ("minus_hundred", "", -100.0, False),  # ART's tic-tac-toe: an illegal move
    ("five", "", 5.0, True),  # at or above the default threshold, 1
    ("five", "correct_threshold = 5\n", 5.0, True),
    ("five", "correct_threshold = 10\n", 5.0, False),
    ("minus_hundred", "correct_threshold = -200\n", -100.0, True),
    ("five_marked_wrong", "", 5.0, False),  # its own `correct` metric decides
    ("minus_one_marked_right", "correct_threshold = 5\n", -1.0, True),
]


@pytest.mark.parametrize(("name", "rollout_lines", "reward", "correct"), REWARDS)
async def test_any_finite_reward_is_kept_and_correct_follows_the_declared_rule(
    tmp_path: Path, name: str, rollout_lines: str, reward: float, correct: bool
) -> None:
    """ART's rewards are any real number: kept as the function set it (ART takes advantages
    within a group); correct is the function's `correct` metric, else the scenario's
    `correct_threshold`, and evaluation and the run files state that rule."""
    path = scenario_file(tmp_path, case(name), rollout=rollout_lines)
    task = load_scenario(str(path))
    t = await rollout(offline_model(), task.splits["val"][0])
    assert t.reward == reward and t.metrics["rollout_error"] == 0.0
    assert t.metrics["correct"] == float(correct)
    report = await evaluate(offline_model(), task.splits["val"])
    assert report.accuracy == float(correct) and report.mean_reward == reward
    threshold = rollout_lines.partition("= ")[2].strip() or "1"
    declared = " (the scenario's correct_threshold)" if rollout_lines else ""
    assert task.correct_rule == f"the `correct` metric if set, else reward >= {threshold}{declared}"


async def test_every_rollout_failing_is_an_error_not_a_zero(tmp_path: Path) -> None:
    task = load_scenario(str(scenario_file(tmp_path, case("raises"))))
    with pytest.raises(RolloutsFailed, match=r"all 6 batch 0 rollouts failed.*agent crashed"):
        await gather_groups(offline_model(), task.splits["train"][:3], 2, description="batch 0")
    with pytest.raises(RolloutsFailed, match=r"all 3 val rollouts failed.*agent crashed"):
        await evaluate(offline_model(), task.splits["val"])


async def test_python_api_runs_a_callable_and_counts_failures() -> None:
    async def half_right(model: art.Model, record: dict[str, Any]) -> art.Trajectory:
        if record["a"] % 2:
            raise ValueError("odd")
        return art.Trajectory(reward=1.0)

    task = rollout_scenario(half_right, source=SOURCE, name="half")
    scenarios = task.splits["train"]
    groups = await gather_groups(offline_model(), scenarios, 2, seed=0)
    rewards = [t.reward for g in groups for t in g.trajectories]
    errors = [bool(t.metrics["rollout_error"]) for g in groups for t in g.trajectories]
    odd = [s.x["a"] % 2 == 1 for s in scenarios for _ in range(2)]
    assert errors == odd and rewards == [0.0 if e else 1.0 for e in errors]
    assert 0 < sum(errors) < len(errors)  # this record set has both kinds
    # nothing was sampled by the failed ones: training gets the rest only
    kept = [len(g.trajectories) for g in trainable(groups)]
    assert kept == [0 if s.x["a"] % 2 else 2 for s in scenarios]
    report = await evaluate(offline_model(), task.splits["val"])
    odd_val = sum(s.x["a"] % 2 for s in task.splits["val"])
    assert report.errors == odd_val and "odd" in (report.first_error or "")
    assert math.isclose(report.accuracy, (3 - odd_val) / 3)


@pytest.mark.parametrize("system_prompt", ["Reply with only the number.", None])
def test_a_function_without_context_runs_gepa_and_ei_from_a_system_prompt(
    tmp_path: Path, system_prompt: str | None
) -> None:
    """A (model, record) function receives GEPA's candidate and EI's hinted prompt through its
    client, so both run on it; without a system prompt to start from they are refused."""
    from art_rlvr.ei.config import EIConfig
    from art_rlvr.ei.config import start_problem as ei_problem
    from art_rlvr.gepa.config import GEPAConfig
    from art_rlvr.gepa.start import start_problem as gepa_problem

    path = scenario_file(tmp_path, case("always_right"), system_prompt=system_prompt)
    two = load_scenario(str(path))
    seed = two.default_system_prompt
    gepa, ei = gepa_problem(GEPAConfig(pareto_size=2), two, seed), ei_problem(EIConfig(), two)
    if system_prompt is not None:
        assert gepa is None and ei is None
    else:
        assert gepa and "there is no seed prompt" in gepa and "model.openai_client()" in gepa
        assert ei and "the scenario has no system_prompt" in ei
        assert ei_problem(EIConfig(), two, "A prompt of the run's.") is None
        assert gepa_problem(GEPAConfig(pareto_size=2), two, "A prompt of the run's.") is None
    three = load_scenario(str(scenario_file(tmp_path, case("answer"), system_prompt=system_prompt)))
    assert gepa_problem(GEPAConfig(pareto_size=2), three, seed) is None
    assert ei_problem(EIConfig(), three) is None


def scripted_policy(server: ScriptedServer) -> art.Model:
    return art.Model(
        name="scripted", project="tests", inference_base_url=server.base_url,
        inference_api_key="k", inference_model_name="scripted",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("function", "how"),
    [("game_like", "replaced in 1"), ("captured", "inserted in 1")],  # own system message, none
)
async def test_a_system_prompt_reaches_a_function_without_context_through_its_client(
    tmp_path: Path, function: str, how: str
) -> None:
    """The run's system prompt (GEPA's candidate) reaches an unchanged (model, record) function's
    request, as the server received it; the trajectory records what was sent."""
    task = load_scenario(str(scenario_file(tmp_path, case(function))))
    sc = task.splits["val"][0]
    with ScriptedServer([], default=Step.reply("7")) as server:
        t = await rollout(scripted_policy(server), sc, system_prompt="Evolved prompt.")
        received = [r.body["messages"] for r in server.chat_requests]
    (messages,) = received
    assert messages[0] == {"role": "system", "content": "Evolved prompt."}
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "You are a calculator." not in json.dumps(received)
    assert t.metrics["rollout_error"] == 0.0 and t.metadata["system_prompt_sent"] == how
    assert turns(t)[0] == messages[0] and [m["role"] for m in turns(t)][-1] == "assistant"
    stored = stored_trajectory(t)
    assert stored.opening[0].content == "Evolved prompt."


async def test_a_function_with_a_client_of_its_own_is_told_the_prompt_missed_it(
    tmp_path: Path,
) -> None:
    task = load_scenario(str(scenario_file(tmp_path, case("own_client"))))
    with ScriptedServer([], default=Step.reply("7")) as server:
        t = await rollout(scripted_policy(server), task.splits["val"][0])
        (request,) = server.chat_requests
    assert request.body["messages"][0]["role"] == "user"  # nothing reached it
    reason = rollout_failure(t) or ""
    assert reason.startswith("the system prompt did not reach 1 request(s)")
    assert "model.openai_client()" in reason and t.reward == 0.0


async def test_a_third_parameter_of_its_own_is_left_to_it(tmp_path: Path) -> None:
    task = load_scenario(str(scenario_file(tmp_path, case("own_flag"))))
    assert task.rollout_fn is not None and not task.rollout_fn.takes_context
    t = await rollout(offline_model(), task.splits["val"][0])
    assert t.reward == 1.0 and t.metrics["rollout_error"] == 0.0  # verbose kept its default


def test_the_helpers_beside_a_rollout_file_import(tmp_path: Path) -> None:
    """ART's examples import what sits beside them (`from utils import ...`), at import time
    and inside the function: the file's folder is on the path, as `python rollout.py` has it."""
    folder = tmp_path / "example_xyz"
    folder.mkdir()
    (folder / "helpers_xyz.py").write_text("WINNING_VALUE = 2048\n")
    (folder / "rollout.py").write_text(
        "import art\nfrom helpers_xyz import WINNING_VALUE\n\n"
        "async def rollout(model, record):\n"
        "    return art.Trajectory(reward=float(WINNING_VALUE == 2048))\n"
    )
    task = load_scenario(str(scenario_file(folder, "rollout.py:rollout")))
    assert task.rollout_fn is not None and task.rollout_fn.fn.__module__ == "rollout"


async def test_the_context_carries_prompt_sampling_and_seed(tmp_path: Path) -> None:
    seen: list[RolloutContext] = []

    async def spy(model: art.Model, record: dict[str, Any], context: RolloutContext):
        seen.append(context)
        return art.Trajectory(reward=0.5)

    task = rollout_scenario(spy, source=SOURCE, system_prompt="default prompt")
    sc = task.splits["val"][0]
    sampling = SamplingConfig(max_tokens=7, temperature=0.3, seed=11)
    t = await rollout(offline_model(), sc, system_prompt="evolved", sampling=sampling, step=2)
    assert seen[0].system_prompt == "evolved" and seen[0].seed == 11 and seen[0].step == 2
    assert seen[0].sampling.max_tokens == 7 and seen[0].scenario_id == sc.id
    assert t.reward == 0.5 and t.metrics["correct"] == 0.0  # is_correct's rule: reward >= 1
    await rollout(offline_model(), sc)
    assert seen[1].system_prompt == "default prompt"


def test_cli_eval_of_a_rollout_function_reports_pass_at_k(tmp_path: Path) -> None:
    """`mode=eval` through the CLI on a `[rollout]` scenario: the function's requests reach the
    policy's endpoint and the reward it sets decides pass@k and pass^k (against a reference
    computed from the journaled rows); a second run reuses every rollout."""
    from clirun import base_env, cli

    from art_rlvr.eval.evaluate import pass_all_k, pass_at_k

    path = scenario_file(tmp_path, case("answer"))
    val = load_scenario(str(path)).splits["val"]
    every_answer = " ".join(str(s.x["answer"]) for s in val)  # right for any item
    script = [Step.reply(every_answer), Step.reply("no idea")] * len(val)
    args = [
        f"scenario={path}", "mode=eval", "policy.model=openai/scripted", "eval_samples=2",
        "eval_temperature=1.0", f"run_dir={tmp_path / 'run'}",
    ]  # fmt: skip
    with ScriptedServer(script) as llm:
        done = cli([*args, f"policy.api_base={llm.base_url}"], base_env())
        assert done.returncode == 0, done.stderr[-3000:]
        assert len(llm.requests) == 6
        again = cli([*args, f"policy.api_base={llm.base_url}", "resume=true"], base_env())
        assert again.returncode == 0, again.stderr[-3000:]
        assert len(llm.requests) == 6  # nothing asked twice
    folder = next((tmp_path / "run" / "evals").glob("val_*"))
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["rollouts"] == 6 and meta["errors"] == 0 and meta["reused_rollouts"] == 6
    rows = [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines()]
    correct = {
        s.id: sum(JournalRow.model_validate(r).correct for r in rows if r["item"] == s.id)
        for s in val
    }
    assert sum(correct.values()) == 3
    for k in (1, 2):
        assert meta["pass_at_k"][str(k)] == pytest.approx(
            sum(pass_at_k(2, c, k) for c in correct.values()) / 3
        )
        assert meta["pass_all_k"][str(k)] == pytest.approx(
            sum(pass_all_k(2, c, k) for c in correct.values()) / 3
        )


def test_cli_eval_of_rewards_of_five_and_minus_hundred_states_its_correct_rule(
    tmp_path: Path,
) -> None:
    """`mode=eval` through the CLI on a function whose rewards are 5 (right) and -100 (wrong),
    with `correct_threshold = 5` declared: the mean reward is ART's, pass@k counts the 5s, and
    metadata.json and summary.json say what counted as correct."""
    from clirun import base_env, cli

    path = scenario_file(tmp_path, case("five_or_minus_hundred"), rollout="correct_threshold = 5\n")
    val = load_scenario(str(path)).splits["val"]
    script = [Step.reply(str(s.x["answer"])) if i == 0 else Step.reply("no idea")
              for i, s in enumerate(val)]  # fmt: skip
    args = [
        f"scenario={path}", "mode=eval", "policy.model=openai/scripted",
        f"run_dir={tmp_path / 'run'}",
        "policy.max_in_flight=1",  # the script answers in arrival order: one request at a time
    ]  # fmt: skip
    with ScriptedServer(script) as llm:
        done = cli([*args, f"policy.api_base={llm.base_url}"], base_env())
    assert done.returncode == 0, done.stderr[-3000:]
    folder = next((tmp_path / "run" / "evals").glob("val_*"))
    meta = json.loads((folder / "metadata.json").read_text())
    rule = "the `correct` metric if set, else reward >= 5 (the scenario's correct_threshold)"
    assert meta["correct_rule"] == f"outcome.is_correct: {rule}"
    assert meta["reward_mean"] == pytest.approx((5 - 100 - 100) / 3)
    assert meta["pass_at_k"]["1"] == pytest.approx(1 / 3) and meta["errors"] == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["correct_rule"] == rule
    assert f"correct (mine): {rule}" in (tmp_path / "run" / "run.log").read_text()


def test_cli_eval_where_every_rollout_fails_exits_with_the_cause(tmp_path: Path) -> None:
    from clirun import base_env, cli

    path = scenario_file(tmp_path, case("raises"))
    args = [f"scenario={path}", "mode=eval", "policy.model=openai/scripted",
            "policy.api_base=http://127.0.0.1:9/v1", f"run_dir={tmp_path / 'run'}"]  # fmt: skip
    done = cli(args, base_env())
    assert done.returncode == 1
    assert "rollouts failed" in done.stderr and "agent crashed" in done.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert "agent crashed" in summary["failed"]


async def test_a_function_on_the_embedded_model_trains_one_step(tmp_path: Path, make_model):
    """RL on rollout functions with the real model: one function keeps ART's `Choice`s, one
    keeps nothing (art_rlvr's capture scope records its request); both train on served ids."""
    model = await make_model("rf")
    for name in ("answer", "captured"):
        path = tmp_path / name
        path.mkdir()
        task = load_scenario(str(scenario_file(path, case(name), timeout_s=300)))
        groups = await gather_groups(
            model, task.splits["train"][:2], 2, sampling=SamplingConfig(max_tokens=6), seed=0
        )
        trajectories = [t for g in groups for t in g.trajectories]
        assert all(t.metrics["rollout_error"] == 0.0 for t in trajectories)
        assert all(0 < t.metrics["completion_tokens"] <= 6 for t in trajectories)
        if name == "captured":  # run files, GEPA and the report read the exchange
            assert all(len(t.exchanges.chat_completions) == 1 for t in trajectories)
            row = stored_trajectory(trajectories[0])
            reply = trajectories[0].exchanges.chat_completions[0].response.choices[0]
            x = task.splits["train"][0].x
            assert [(m.role, m.content) for m in row.opening] == [
                ("system", "Reply with only the number."),  # the scenario's, inserted as sent
                ("user", f"{x['a']} + {x['b']} ="),
            ]
            assert row.completion == (reply.message.content or "")
            assert row.to_art().exchanges == trajectories[0].exchanges
            assert [m["role"] for m in turns(trajectories[0])] == ["system", "user", "assistant"]
        for g in groups:  # spread the rewards so that every group carries signal
            for i, t in enumerate(g.trajectories):
                t.reward = float(i % 2)
        step = await model.get_step()
        result = await model.backend().train(model, trainable(groups), learning_rate=1e-4)
        assert result.step == step + 1 and result.metrics["turns_served"] == 4


def served_prompts(backend, model: art.Model) -> list[str]:
    """The prompts TorchBackend's server received for `model`, decoded from the ids it
    recorded for every completion it returned (its own record, not the client's)."""
    trainee = backend._trainees[model.name]
    return [trainee.tokenizer.decode(list(t.prompt_ids)) for t in trainee.served.turns()]


async def test_art_style_rewards_of_minus_one_to_one_train_one_rl_step_and_evaluate(
    tmp_path: Path, backend, make_model
) -> None:
    """`mode=rl` for one step on an unchanged ART-shaped function (two parameters, its own
    system message, rewards in {-1, 0, 1} as ART's 2048) with the embedded model: the batch
    trains on ART's group advantages of those rewards, and the evaluations judge correct by
    the default threshold (reward >= 1)."""
    import time

    from art_rlvr.config.run_config import parse_args
    from art_rlvr.loops.context import RunContext
    from art_rlvr.loops.runner import run_phases
    from art_rlvr.rundir.files import RunFiles

    path = scenario_file(tmp_path, case("game_like"), system_prompt=None, timeout_s=300)
    task = load_scenario(str(path))
    run = tmp_path / "run"
    cfg = parse_args(
        [f"scenario={path}", "mode=rl", "n_batches=1", "groups_per_batch=3", "group_size=4",
         "val_limit=3", "eval_test=false", f"run_dir={run}"]
    )  # fmt: skip
    model = await make_model("rf-rl")
    ctx = RunContext(cfg, task, backend, model, RunFiles(run), time.monotonic())
    summary = await run_phases(ctx)
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (train,) = [e for e in events if e["event"] == "train"]
    rows = read_trajectories(run / "trajectories" / "train_0001.jsonl")
    by_step = [read_trajectories(run / "trajectories" / f"val_000{i}.jsonl") for i in (0, 1)]
    held = [r for rs in by_step for r in rs]
    rewards = [r.reward for r in rows]
    assert {r.reward for r in [*rows, *held]} <= {-1.0, 0.0, 1.0} and -1.0 in rewards
    assert train["reward_mean"] == pytest.approx(sum(rewards) / len(rewards))
    # trained: a group with a spread of rewards (all 3 groups equal: ~1 run in 1000 here)
    assert train["train/groups_used"] >= 1 and train["train/turns_served"] > 0
    assert summary["steps"] == 1 and await model.get_step() == 1
    assert all(r.metrics["correct"] == float(r.reward >= 1) for r in [*rows, *held])
    evals = [e for e in events if e["event"] == "eval" and e["split"] == "val"]
    assert [e["step"] for e in evals] == [0, 1]
    for e, rs in zip(evals, by_step, strict=True):  # each evaluation, from its own rows
        assert len(rs) == 3 and e["reward_mean"] == pytest.approx(sum(r.reward for r in rs) / 3)
        assert e["accuracy"] == pytest.approx(sum(r.correct for r in rs) / 3)
    assert task.correct_rule == "the `correct` metric if set, else reward >= 1"
    assert all(r.episode[0].content == "You are a calculator." for r in rows)  # as it wrote it


EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples" / "rollouts"


@pytest.mark.slow
def test_cli_rl_on_the_agents_sdk_example(tmp_path: Path, monkeypatch) -> None:
    """docs/rollouts.md's OpenAI Agents SDK agent: `mode=rl` through the CLI's main with the
    embedded model; its batch trains on the ids the server sampled (ART's client asks)."""
    from clirun import base_env, cli

    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    done = cli(
        [
            f"scenario={EXAMPLES / 'agents_calc.toml'}", "mode=rl", "n_batches=1",
            "groups_per_batch=1", "group_size=2", "val_limit=1", "eval_test=false",
            f"run_dir={run}",
        ],
        base_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    events = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    (train,) = [e for e in events if e["event"] == "train"]
    assert [e["step"] for e in events if e["event"] == "eval"] == [0, 1]
    assert json.loads((run / "summary.json").read_text())["steps"] == 1
    assert train["trajectories"] == 2.0 and train["tokens_per_completion"] > 0
    rows = read_trajectories(run / "trajectories" / "train_0001.jsonl")
    assert len(rows) == 2 and all(r.metrics["rollout_error"] == 0.0 for r in rows)
    # the agent's last request and reply, read from ART's exchanges: instructions, question
    assert all(r.episode[0].content.startswith("Call the multiply tool") for r in rows)


@pytest.mark.slow
def test_cli_eval_on_the_langgraph_example(tmp_path: Path, monkeypatch) -> None:
    """docs/rollouts.md's LangGraph agent through `art.langgraph`: `mode=eval` with two samples
    per item; every rollout ran (none errored) and its episodes were kept."""
    from clirun import base_env, cli

    monkeypatch.chdir(tmp_path)  # ART's wrap_rollout logs into ./.art/langgraph
    run = tmp_path / "run"
    done = cli(
        [
            f"scenario={EXAMPLES / 'langgraph_calc.toml'}", "mode=eval", "val_limit=2",
            "eval_samples=2", "eval_temperature=1.0", f"run_dir={run}",
        ],
        base_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    folder = next((run / "evals").glob("val_*"))
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["rollouts"] == 4 and meta["errors"] == 0
    assert set(meta["pass_at_k"]) == {"1", "2"}
    rows = [
        JournalRow.model_validate_json(line).stored
        for line in (folder / "rollouts.jsonl").read_text().splitlines()
    ]
    assert all(r.metrics["rollout_error"] == 0.0 for r in rows)
    assert all(r.metrics["completion_tokens"] > 0 for r in rows)  # LangChain's usage
    # the forced call, the tool's product, then the reply are kept (a call cut by max_tokens
    # at temperature 1 is no call, so not every episode has one)
    assert any(
        any(c.name == "multiply" for m in r.episode for c in m.tool_calls)
        and any(m.role == "tool" for m in r.episode)
        for r in rows
    )


def scripted_gepa(server: ScriptedServer, **sizes: Any) -> Any:
    """GEPA's config with a scripted reflector on loopback (its key in SCRIPTED_ROLLOUT_KEY)."""
    from art_rlvr.gepa.config import GEPAConfig

    reflection = server.role("SCRIPTED_ROLLOUT_KEY")
    return GEPAConfig(reflection=reflection, report_val_limit=0, traces_per_iteration=2, **sizes)


async def test_gepa_evolves_the_prompt_a_rollout_function_receives(tmp_path: Path) -> None:
    """GEPA on a rollout function, reflecting through a scripted reflector on loopback: the
    candidate reaches the function as `context.system_prompt`, and the better one wins."""
    from art_rlvr.gepa.optimizer import optimize_prompt

    task = load_scenario(str(scenario_file(tmp_path, case("prompt_judged"))))
    better = "Check twice, then reply with only the number."
    reply = Step.reply(f"Here is the improved instruction:\n```\n{better}\n```")
    with pytest.MonkeyPatch.context() as patch, ScriptedServer([], default=reply) as server:
        patch.setenv("SCRIPTED_ROLLOUT_KEY", "k")
        config = scripted_gepa(
            server, max_metric_calls=40, pareto_size=3, group_size=2, max_iterations=2
        )
        result = await optimize_prompt(
            offline_model(), task, config=config, run_dir=tmp_path / "gepa"
        )
        asked = server.chat_requests
    assert asked and "wrong: the prompt should say check twice" in json.dumps(asked[0].body)
    assert result.best_prompt == better and result.seed_prompt == "Reply with only the number."


async def test_gepa_on_an_unchanged_two_parameter_rollout_reaches_the_server(
    tmp_path: Path, backend, make_model
) -> None:
    """GEPA on ART's own shape (two parameters, a system message of its own) with the embedded
    model and a scripted reflector on loopback: every candidate reached TorchBackend's server as
    the system message of the prompt it sampled from (read from the server's own record of
    what it served), the function's own system message never did, and the reflector saw the
    episodes as they ran."""
    from art_rlvr.gepa.optimizer import optimize_prompt

    task = load_scenario(str(scenario_file(tmp_path, case("game_like"), timeout_s=300)))
    model = await make_model("rf-gepa")
    better = "Add the two numbers and reply with the sum only."
    reply = Step.reply(f"Improved:\n```\n{better}\n```")
    with pytest.MonkeyPatch.context() as patch, ScriptedServer([], default=reply) as server:
        patch.setenv("SCRIPTED_ROLLOUT_KEY", "k")
        config = scripted_gepa(
            server, max_metric_calls=24, pareto_size=2, group_size=1, max_iterations=1,
            max_tokens=8,
        )  # fmt: skip
        result = await optimize_prompt(model, task, config=config, run_dir=tmp_path / "gepa")
        asked = json.dumps([r.body for r in server.chat_requests])
    prompts = served_prompts(backend, model)
    seed = "Reply with only the number."
    systems = {p.split("<|im_start|>system\n", 1)[1].split("<|im_end|>", 1)[0] for p in prompts}
    assert result.seed_prompt == seed and systems == {seed, better}
    assert not any("You are a calculator." in p for p in prompts)
    assert len(prompts) == result.metric_calls_used
    assert "What is " in asked  # the episode's user turn, as the function sent it


def test_docs_show_the_examples_verbatim() -> None:
    """docs/rollouts.md's examples are the files the slow tests run, so they cannot go stale."""
    docs = (EXAMPLES.parents[1] / "rollouts.md").read_text()
    for name in ("agents_calc.py", "agents_calc.toml", "langgraph_calc.py"):
        assert (EXAMPLES / name).read_text() in docs, f"docs/rollouts.md lacks {name}"


@pytest.mark.parametrize(
    ("function", "mode", "message"),
    [
        ("always_right", "gepa", "takes (model, record) and there is no seed prompt"),
        ("always_right", "ei", "takes (model, record) and the scenario has no system_prompt"),
    ],
)
def test_cli_refuses_a_mode_the_function_cannot_serve_before_loading(
    tmp_path: Path, function: str, mode: str, message: str
) -> None:
    from clirun import base_env, cli

    path = scenario_file(tmp_path, case(function), system_prompt=None)
    done = cli([f"scenario={path}", f"mode={mode}", f"run_dir={tmp_path / 'run'}"], base_env())
    assert done.returncode == 2 and message in done.stderr
    assert not (tmp_path / "run").exists()  # refused before the run folder exists


# ------------------------------------------------------------------ expert iteration

HINT = "Marker-K4 add the ones first, then carry"
CLEAN = "Reply with only the number."


def sampled(text: str) -> Choice:
    """A sampled turn as ART's client returns it, with the server's token data."""
    return Choice.model_validate(
        {"index": 0, "finish_reason": "stop", "prompt_token_ids": [1, 2], "token_ids": [3],
         "message": {"role": "assistant", "content": text}}
    )  # fmt: skip


def hinted_episode(system: list[dict[str, str]], reply: str = "7") -> art.Trajectory:
    user = {"role": "user", "content": "What is 3 + 4?"}
    tool = {"role": "tool", "content": "4 + 3 = 7", "tool_call_id": "c1"}
    return art.Trajectory(
        messages_and_choices=[*system, user, sampled("call"), tool, sampled(reply)], reward=1.0
    )


@pytest.mark.parametrize(
    ("clean", "system", "expected"),
    [
        (CLEAN, [{"role": "system", "content": hinted_system(CLEAN, HINT)}], [CLEAN]),
        ("", [{"role": "system", "content": hinted_system("", HINT)}], []),  # the message goes
        (CLEAN, [{"role": "system", "content": CLEAN}], None),  # context ignored: no hint sent
        (CLEAN, [{"role": "system", "content": hinted_system(CLEAN, HINT)}] * 2, None),
        (CLEAN, [], None),
    ],
)
def test_a_functions_hinted_episode_gets_its_clean_system_prompt_back(
    clean: str, system: list[dict[str, str]], expected: list[str] | None
) -> None:
    from art_rlvr.ei.relabel import hint_leaks, opening_of, relabel_function_episode

    episode = hinted_episode(system)
    out = relabel_function_episode(episode, clean, hinted_system(clean, HINT))
    if expected is None:
        assert out is None
        return
    assert out is not None
    items = out.messages_and_choices
    assert [m["content"] for m in opening_of(out) if m["role"] == "system"] == expected
    assert [m["role"] for m in turns(out)] == [*(["system"] * len(expected)), "user",
                                               "assistant", "tool", "assistant"]  # fmt: skip
    assert [m["content"] for m in turns(out)[-4:]] == ["What is 3 + 4?", "call", "4 + 3 = 7", "7"]
    assert all(not (i.model_extra or {}) for i in items if not isinstance(i, dict))
    assert "Marker-K4" not in json.dumps(turns(out)) and not hint_leaks(
        out, HINT, len(expected) + 1
    )
    assert out.metadata["relabelled"] is True and out.reward == 1.0


def test_a_hint_echoed_by_the_function_is_caught_after_relabelling() -> None:
    from art_rlvr.ei.relabel import hint_leaks, opening_of, relabel_function_episode

    system = [{"role": "system", "content": hinted_system(CLEAN, HINT)}]
    echo = hinted_episode(system, reply="add the ones first, then carry: 7")
    out = relabel_function_episode(echo, CLEAN, hinted_system(CLEAN, HINT))
    assert out is not None and hint_leaks(out, HINT, len(opening_of(out))) == [4]


async def test_expert_iteration_runs_a_rollout_function_and_distils_no_hint(
    tmp_path: Path, backend, make_model
) -> None:
    """A round of EI on a rollout function with the embedded model and a scripted teacher over
    loopback: hinted attempts receive the hint in `context.system_prompt`, correct ones are
    relabelled to the clean prompt, and nothing distilled carries the hint."""
    import time

    from art_rlvr.config.run_config import parse_args
    from art_rlvr.ei.data import RoundBuffer
    from art_rlvr.ei.expert import sft_trajectories
    from art_rlvr.loops.context import RunContext
    from art_rlvr.loops.runner import run_ei
    from art_rlvr.rundir.files import RunFiles

    task = load_scenario(str(scenario_file(tmp_path, case("answer"), timeout_s=300)))
    model = await make_model("rf-ei")
    run = tmp_path / "run"
    with (
        pytest.MonkeyPatch.context() as patch,
        ScriptedServer([], default=Step.reply(HINT)) as server,
    ):
        patch.setenv("SCRIPTED_ROLLOUT_KEY", "k")
        args = {"mode": "ei", "run_dir": run, "max_tokens": 12, "val_limit": 1,
                "eval_test": "false", "rounds": 1, "scenarios_per_round": 6, "group_size": 1,
                "hinted_samples_per_x": 6, "sft_epochs": 1, "enable_teacher_hints": "true",
                "answer_field": "answer", "teacher.model": "openai/scripted",
                "teacher.api_base": server.base_url, "teacher.api_key_env": "SCRIPTED_ROLLOUT_KEY",
                "teacher.timeout_s": 5, "teacher.max_retries": 0}  # fmt: skip
        cfg = parse_args([f"{k}={v}" for k, v in args.items()])
        ctx = RunContext(cfg, task, backend, model, RunFiles(run), time.monotonic())
        await run_ei(ctx, cfg.ei)
        asked = [json.dumps(r.body) for r in server.chat_requests]
    (stats,) = [m for m in ctx.files.metrics() if m["event"] == "ei_round"]
    unsolved = stats["scenarios"] - stats["clean_solved"]
    assert unsolved >= 2 and stats["hints_generated"] == unsolved == len(asked)
    assert all("What is" in a for a in asked)  # the problem as the function's attempt sent it
    assert stats["hinted_attempts"] == 6 * unsolved and stats["hinted_unrelabelled"] == 0
    hinted = read_trajectories(run / "trajectories" / "hinted_0000.jsonl")
    assert hinted and all(
        HINT in row.model_dump_json() for row in hinted
    )  # the hint reached the agent
    assert stats["recovered"] >= 1 and stats["examples_from_hints"] >= 1
    buffer = RoundBuffer.model_validate_json((run / "ei" / "round_0000.json").read_text())
    for example in buffer.examples:
        assert [m["content"] for m in example.messages if m["role"] == "system"] == [CLEAN]
    trained = json.dumps([t.model_dump(mode="json") for t in sft_trajectories(buffer, cfg.ei)])
    assert "Marker-K4" not in trained and "Hint" not in trained
    assert stats["trained"]
    evals = [(m["round"], m["step"]) for m in ctx.files.metrics() if m["event"] == "eval"]
    assert evals == [(0, 0), (1, 1)]  # each evaluation: the round it precedes, the model's step
    assert {p.name for p in (run / "trajectories").glob("val_*")} == {
        "val_0000.jsonl",
        "val_0001.jsonl",
    }


async def test_expert_iteration_hints_an_unchanged_two_parameter_function_through_its_client(
    tmp_path: Path,
) -> None:
    """EI on ART's shape (two parameters, its own system message) with a scripted policy and a
    scripted teacher on loopback: the clean attempts are sent the scenario's system prompt, the
    hinted ones the hinted prompt, both in place of the function's own (as the policy server
    received them), and a correct hinted episode is relabelled to the clean prompt."""
    from art_rlvr.ei.config import EIConfig
    from art_rlvr.ei.expert import collect_round
    from art_rlvr.ei.hints import hinted_system, make_teacher
    from art_rlvr.ei.relabel import relabel_hinted_episode
    from art_rlvr.llm.client import LLMCounters

    task = load_scenario(str(scenario_file(tmp_path, case("game_like"))))
    every = " ".join(str(s.x["answer"]) for s in task.splits["train"])  # right for any record
    hinted = hinted_system(CLEAN, HINT)
    with (
        pytest.MonkeyPatch.context() as patch,
        ScriptedServer([], default=Step.reply(HINT)) as teacher_server,
        ScriptedServer([Step.reply("no idea")], default=Step.reply(every)) as policy,
    ):
        patch.setenv("SCRIPTED_ROLLOUT_KEY", "k")
        config = EIConfig(
            scenarios_per_round=1, group_size=1, hinted_samples_per_x=2, max_tokens=8,
            enable_teacher_hints=True, answer_field="answer",
            teacher=teacher_server.role("SCRIPTED_ROLLOUT_KEY", max_retries=0),
        )  # fmt: skip
        teacher, _ = make_teacher(scripted_policy(policy), config, LLMCounters())
        output = await collect_round(scripted_policy(policy), task, config, 0, teacher=teacher)
        systems = [r.body["messages"][0] for r in policy.chat_requests]
    assert [m["role"] for m in systems] == ["system"] * 3
    assert [m["content"] for m in systems] == [CLEAN, hinted, hinted]  # clean, then 2 hinted
    stats = output.buffer.stats
    assert stats.hints_generated == 1 and stats.hinted_unrelabelled == 0 and stats.recovered == 1
    (group,) = output.hinted_groups
    scenario = next(s for s in task.splits["train"] if s.id == group.metadata["scenario_id"])
    for t in group.trajectories:
        assert t.reward == 1.0 and turns(t)[0]["content"] == hinted  # recorded as sent
        relabelled = relabel_hinted_episode(scenario, None, t, HINT)
        assert relabelled is not None and turns(relabelled)[0]["content"] == CLEAN
        assert "Marker-K4" not in json.dumps(turns(relabelled))
