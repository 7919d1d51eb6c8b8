"""verifiers 0.4 environments as scenarios (`scenario=verifiers:<taskset>`, `[verifiers]`,
`verifiers_task`).

The environments are tiny tasksets written in the suite (tests/verifiers_env/vf_envs/: single-turn arithmetic,
an MCP tool env, a multi-turn retry env, a rubric that raises). verifiers runs them for real
(its Env, interception proxy, per-rollout MCP toolset servers and rubric), against the embedded
model on TorchBackend, or a scripted OpenAI-compatible server on loopback where a test needs
exact replies. Training recovers each turn's served ids from the trace's messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import sys
from pathlib import Path

import art
import pytest

from art_rlvr.eval.evaluate import pass_all_k, pass_at_k
from art_rlvr.eval.journal import JournalRow
from art_rlvr.rollouts.functions import rollout_failure, trainable
from art_rlvr.rollouts.rollout import gather_groups, rollout
from art_rlvr.rollouts.sampling import SamplingConfig
from art_rlvr.rollouts.verifiers import load_any, runners_of
from art_rlvr.rollouts.verifiers import verifiers_scenario as vf_task
from art_rlvr.rundir.events import RolloutsFailed
from art_rlvr.scenarios.sources import ScenarioFileError
from art_rlvr.testing.scripted_server import ScriptedServer, Step

ENVS = Path(__file__).parent / "vf_envs"
sys.path.insert(0, str(ENVS))  # verifiers imports a taskset by its top-level module name
os.environ["PYTHONPATH"] = os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")])


ARITH_ARGS = {"n": 12, "seed": 0}
SHORT = SamplingConfig(max_tokens=12)


@pytest.fixture(scope="module")
def arith():
    return vf_task("vf_arith", args=ARITH_ARGS, splits={"train": 8, "val": 2, "test": 2})


@pytest.fixture
async def closing():
    """Tasks whose verifiers environments this test's event loop serves, closed at its end
    (each test runs in a loop of its own; the CLI closes them itself)."""
    tasks: list = []
    yield tasks.append
    for runner in (r for task in tasks for r in runners_of(task)):
        await runner.aclose()


def scripted_model(server: ScriptedServer) -> art.Model:
    return art.Model(
        name="scripted", project="tests", inference_base_url=server.base_url,
        inference_api_key="k", inference_model_name="scripted",
    )  # fmt: skip


def toml_scenario(folder: Path, body: str) -> Path:
    path = folder / "vf.toml"
    path.write_text(body)
    return path


# ---------------------------------------------------------------- loading


def test_the_three_forms_load_the_same_records(tmp_path: Path, arith) -> None:
    """CLI (`verifiers:<id>` with `source.k=v` as taskset args), TOML (`[verifiers]`) and the
    Python API give the same tasks, split the same seeded way, under stable ids."""
    toml = toml_scenario(
        tmp_path,
        'name = "vf"\n[verifiers]\nid = "vf_arith"\nargs = { n = 12, seed = 0 }\n'
        "splits = { train = 8, val = 2, test = 2 }\n",
    )
    cli = load_any("verifiers:vf_arith", overrides=ARITH_ARGS)  # default split 80/10/10
    from_file = load_any(str(toml))
    assert from_file.path == toml and from_file.name == "vf"
    for task in (arith, from_file):
        assert {k: len(v) for k, v in task.splits.items()} == {"train": 8, "val": 2, "test": 2}
        assert task.default_system_prompt == "Reply with only the number."
        assert task.rollout_fn is not None and task.rollout_fn.takes_context
    ids = [[s.id for s in t.splits[k]] for t in (arith, from_file) for k in ("train", "val")]
    assert ids[:2] == ids[2:] and len(set(ids[0] + ids[1])) == 10
    record = arith.splits["val"][0].x
    assert set(record) == {"id", "index", "data"} and record["data"]["answer"].isdigit()
    all_cli = sorted(s.id for split in cli.splits.values() for s in split)
    assert all_cli == sorted(s.id for split in arith.splits.values() for s in split)


INFINITE = "not supported: taskset 'vf_duel' is infinite (it yields tasks forever)"
LOAD_ERRORS = [
    ("no_such_taskset_xyz", {}, "taskset 'no_such_taskset_xyz' not found"),
    ("vf_duel", {"args": {}}, INFINITE),  # no splits: 80/10/10 of forever
    ("vf_duel", {"args": {}, "splits": {"train": 4, "test": "4:"}}, INFINITE),
    (
        "vf_duel",
        {"args": {}, "splits": {"train": 2}, "agent": {"max_turns": 2}},
        "not supported: an `agent` section for taskset 'vf_duel', whose Env declares the "
        "seat(s) player0, player1 (write seats.<seat>)",
    ),
    (
        "vf_duel",
        {"args": {}, "splits": {"train": 2}, "seats": {"player1": {"model": "gpt-x"}}},
        "not supported: seats.player1.model (every seat plays the policy being trained",
    ),
    (
        "vf_duel",
        {"args": {}, "splits": {"train": 2}, "seats": {"player0": {"bogus": 1}}},
        "player0.bogus: not supported (its config has no such key)",
    ),
    (
        "vf_duel",
        {"args": {}, "splits": {"train": 2}, "seat": "player2"},
        "not supported: seat = 'player2'; taskset 'vf_duel' declares player0, player1",
    ),
    ("vf_no_all", {}, "defines no `__all__`"),
    ("vf_two", {}, "exports 2 Taskset subclasses"),
    ("vf_arith", {"splits": {"train": 20}}, "splits.train asks for tasks 0:20; the taskset has 12"),
    ("vf_arith", {"args": {"n": "many"}}, "taskset.n: Input should be a valid integer"),
]


@pytest.mark.parametrize(("ident", "options", "message"), LOAD_ERRORS)
def test_load_errors_are_one_line(ident: str, options: dict, message: str) -> None:
    options = {"args": ARITH_ARGS, **options}
    with pytest.raises(ScenarioFileError) as error:
        vf_task(ident, **options)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ('name = "x"\n[verifiers]\nid = "vf_two"\n', 3, "exports 2 Taskset subclasses"),
        (
            'name = "x"\n[verifiers]\nid = "vf_arith"\nharnes = "null"\n',
            4,
            "verifiers.harnes: not supported ([verifiers] has no such key)",
        ),
        ('name = "x"\nuser_template = "{a}"\n[verifiers]\nid = "vf_arith"\n', 2, "user_template"),
    ],
)
def test_toml_load_errors_name_the_line(tmp_path: Path, body: str, line: int, message: str) -> None:
    path = toml_scenario(tmp_path, body)
    with pytest.raises(ScenarioFileError) as error:
        load_any(str(path))
    assert str(error.value).startswith(f"{path}:{line}: ") and message in str(error.value)


def test_an_agent_section_and_harness_settings_load_as_verifiers_writes_them(
    tmp_path: Path,
) -> None:
    """`[verifiers.agent]` (verifiers' `[env.agent]`) sets the single-agent env's seat, its
    harness settings merged with the chosen harness's; the runtime stays a local subprocess."""
    toml = toml_scenario(
        tmp_path,
        'name = "vf"\n[verifiers]\nid = "vf_arith"\nargs = { n = 4 }\n'
        "splits = { train = 2, val = 1, test = 1 }\n"
        "[verifiers.agent]\nmax_turns = 3\nsampling = { temperature = 0.5 }\n"
        "[verifiers.agent.harness]\ntool_timeout_s = 7\n",
    )
    task = load_any(str(toml))
    (runner,) = runners_of(task)
    agent = runner.env.config.agent
    assert agent.max_turns == 3 and agent.sampling.temperature == 0.5
    assert agent.harness.id == "art_rlvr_harness" and agent.harness.tool_timeout_s == 7
    assert agent.runtime.type == "subprocess" and runner.seat == "agent"


DUELS = [  # (what player0 and player1 say to hand #1, the seat that trains, reward, correct)
    (("It is 1.", "no"), None, 2.0, True),  # player0 (the first seat) wins the stake
    (("no", "1"), None, -2.0, False),
    (("1", "1"), None, 0.0, False),
    (("no", "1"), "player1", 2.0, True),
]


@pytest.mark.parametrize(("said", "seat", "reward", "correct"), DUELS)
async def test_a_two_seat_infinite_taskset_trains_one_seat_on_its_payoff(
    closing, said: tuple[str, str], seat: str | None, reward: float, correct: bool
) -> None:
    """Seats named `player0`/`player1` (kuhn poker's shape) on an infinite taskset: the splits
    bound what is read, both seats play the policy, and the trained seat's zero-sum payoff
    (any real reward, as ART trains) is the trajectory's reward."""
    task = vf_task(
        "vf_duel", splits={"train": 3, "val": 2}, shuffle_seed=None,
        **({"seat": seat} if seat else {}),
    )  # fmt: skip
    closing(task)
    assert [s.x["index"] for s in task.splits["train"]] == [0, 1, 2]
    assert [len(task.splits[k]) for k in ("train", "val", "test")] == [3, 2, 0]
    with ScriptedServer([Step.reply(said[0]), Step.reply(said[1])]) as server:
        t = await rollout(scripted_model(server), task.splits["train"][1], sampling=SHORT)
        systems = [r.body["messages"][0]["content"] for r in server.chat_requests]
    assert systems == ["You are player 0.", "You are player 1."]  # both seats played
    mine = seat or "player0"
    assert rollout_failure(t) is None and t.reward == reward and t.metadata["vf_seat"] == mine
    assert t.metrics["correct"] == float(correct) and t.metadata["vf_traces"] == 2
    assert t.messages()[-1]["content"] == said[int(mine[-1])]


def test_verifiers_missing_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "verifiers.v1", None)  # as if it were not installed
    with pytest.raises(ScenarioFileError, match=r"verifiers is not installed .*\[verifiers\]"):
        vf_task("vf_arith")


def test_expert_iteration_and_gepa_run_on_it(arith) -> None:
    """As for any rollout function with a context: GEPA's candidate and EI's hinted prompt reach
    the environment as every task's system prompt; the teacher finds the gold answer by a
    dotted field of the record (`data.answer`)."""
    from art_rlvr.config.run_config import parse_args
    from art_rlvr.run import mode_problem

    for argv in (["mode=ei"], ["mode=gepa", "gepa.pareto_size=2"],
                 ["mode=ei", "enable_teacher_hints=true", "answer_field=data.answer"]):  # fmt: skip
        cfg = parse_args(["scenario=verifiers:vf_arith", *argv])
        assert mode_problem(cfg, arith) is None
    cfg = parse_args(["scenario=verifiers:vf_arith", "mode=ei", "enable_teacher_hints=true"])
    assert "a nested one as data.answer" in (mode_problem(cfg, arith) or "")


# ---------------------------------------------------------------- episodes


async def test_single_and_multi_turn_episodes_score_and_train_on_served_ids(
    arith, make_model, closing
) -> None:
    """The embedded model through verifiers' Env: a single-turn taskset and a multi-turn env
    that plays the user; the rubric's reward is the trajectory's, each reward and metric is
    logged as `vf/<name>`, and one RL step trains every sampled turn on the ids the server
    recorded for it (recovered from the trace's messages: none re-rendered or skipped)."""
    model = await make_model("vf")
    retry = vf_task("vf_retry", splits={"train": 3}, env_args={"max_tries": 2})
    closing(arith)
    closing(retry)
    single = await gather_groups(model, arith.splits["train"][:2], 2, sampling=SHORT, seed=0)
    multi = await gather_groups(model, retry.splits["train"][:1], 2, sampling=SHORT, seed=0)
    for t in (t for g in single for t in g.trajectories):
        assert t.metrics["rollout_error"] == 0.0 and t.metrics["turns"] == 1.0
        assert t.reward == t.metrics["vf/correct"] == t.metrics["vf/reward"]
        assert {"vf/bare", "vf/reply_chars", "completion_tokens"} <= set(t.metrics)
        assert [m["role"] for m in t.messages()] == ["system", "user", "assistant"]
    for t in (t for g in multi for t in g.trajectories):
        roles = [m["role"] for m in t.messages()]
        tries = t.metrics["vf/tries"]
        assert roles == ["system", "user", *["assistant", "user"] * int(tries - 1), "assistant"]
        if tries == 2:  # the environment answered the wrong first reply
            assert t.messages()[3]["content"] == "Wrong, try again."
    groups = [*single, *multi]
    for g in groups:  # spread the rewards so that every group carries signal
        for i, t in enumerate(g.trajectories):
            t.reward = float(i % 2)
    sampled = sum(
        1 for g in groups for t in g.trajectories for m in t.messages() if m["role"] == "assistant"
    )
    result = await model.backend().train(model, trainable(groups), learning_rate=1e-4)
    m = result.metrics
    assert (m["turns_recovered"], m["turns_rerendered"], m["turns_skipped"]) == (sampled, 0, 0)


async def test_a_tool_episode_calls_the_mcp_toolset_under_the_projects_rules(closing) -> None:
    """A `vf.Toolset` served by verifiers per rollout (an MCP server): its tools reach the
    model in the OpenAI schema, a call's result comes back as a tool message, a tool that
    raises is an error tool message (the episode goes on) and a flood is cut at the cap."""
    task = vf_task(
        "vf_tools", splits={"train": 4}, shuffle_seed=None,
        harness_args={"tool_max_chars": 200, "tool_timeout_s": 30},
    )  # fmt: skip
    closing(task)
    by_answer = {s.x["data"]["answer"]: s for s in task.splits["train"]}
    script = {"5": ({"a": 2, "b": 3}, "The sum is 5."), "100": ({"a": 99, "b": 1}, "Sorry."),
              "99": ({"a": 98, "b": 1}, "Too long.")}  # fmt: skip
    with contextlib.ExitStack() as stack:  # one scripted policy per episode: they run at once
        servers = {
            answer: stack.enter_context(
                ScriptedServer([Step.calls(("add_toolset_add", arguments)), Step.reply(final)])
            )
            for answer, (arguments, final) in script.items()
        }
        episodes = await asyncio.gather(
            *(rollout(scripted_model(s), by_answer[a], sampling=SHORT) for a, s in servers.items())
        )
    for (answer, server), t in zip(servers.items(), episodes, strict=True):
        first = server.chat_requests[0].body
        assert first["tools"][0]["function"]["name"] == "add_toolset_add"
        assert first["tools"][0]["function"]["parameters"]["required"] == ["a", "b"]
        tool = next(m for m in t.messages() if m["role"] == "tool")
        assert t.metrics["rollout_error"] == 0.0 and t.metrics["vf/tool_calls"] == 1.0
        assert t.messages()[-1]["content"] == script[answer][1] and t.tools
        if answer == "5":
            assert tool["content"] == "5" and t.reward == 1.0
        elif answer == "100":
            assert tool["content"].startswith("Error") and "tool exploded" in tool["content"]
            assert t.reward == 0.0
        else:
            assert tool["content"].startswith("x" * 200) and "[truncated: " in tool["content"]


async def test_a_raising_rubric_scores_zero_with_its_reason_and_all_failing_is_an_error(
    closing,
) -> None:
    """verifiers marks a trace whose reward raised as failed: that episode scores 0, counted,
    with verifiers' error text as the reason; a reward over 1 (weights summing to 1.5) trains
    as it is, as ART trains any real reward; when every episode fails the batch is an error
    with the first cause, never a 0.0."""
    task = vf_task("vf_raising", splits={"train": 4}, shuffle_seed=None)
    closing(task)
    train = task.splits["train"]  # answers BOOM, fine, over, BOOM
    with ScriptedServer([], default=Step.reply("ok")) as server:
        model = scripted_model(server)
        groups = await gather_groups(model, train[:3], 1, sampling=SHORT)
        boom, fine, over = (g.trajectories[0] for g in groups)
        with pytest.raises(
            RolloutsFailed, match=r"all 2 rollouts rollouts failed.*rubric exploded"
        ):
            await gather_groups(model, [train[0], train[3]], 1, sampling=SHORT)
    assert (
        rollout_failure(boom) == "TaskError: task BoomTask scoring: RuntimeError: rubric exploded"
    )
    assert boom.reward == 0.0 and boom.metrics["rollout_error"] == 1.0
    assert boom.messages()[-1]["content"] == "ok"  # what was sampled is kept
    assert rollout_failure(over) is None and over.metrics["correct"] == 1.0
    assert over.metrics["vf/reward"] == 1.5 and over.reward == 1.5
    assert rollout_failure(fine) is None and fine.reward == 1.0
    assert "replied=1 (weight 1)" in fine.metadata["feedback"]


# ---------------------------------------------------------------- evaluation and GEPA


def test_cli_eval_reports_pass_at_k_and_resumes(tmp_path: Path) -> None:
    """`mode=eval` through the CLI on `scenario=verifiers:vf_arith` (taskset args as
    `source.` keys) against a scripted policy: pass@k and pass^k equal the reference over the
    journaled rows, and a second session reuses every rollout."""
    from clirun import base_env, cli

    task = load_any("verifiers:vf_arith", overrides={"n": 10})
    (item,) = task.held_out("val", 1)
    script = [Step.reply(item.x["data"]["answer"]), Step.reply("no idea")]
    args = [
        "scenario=verifiers:vf_arith", "source.n=10", "mode=eval", "val_limit=1",
        "policy.model=openai/scripted", "eval_samples=2", "eval_temperature=1.0",
        f"run_dir={tmp_path / 'run'}",
    ]  # fmt: skip
    env = {**base_env(), "PYTHONPATH": os.environ["PYTHONPATH"]}
    with ScriptedServer(script) as llm:
        done = cli([*args, f"policy.api_base={llm.base_url}"], env)
        assert done.returncode == 0, done.stderr[-3000:]
        again = cli([*args, f"policy.api_base={llm.base_url}", "resume=true"], env)
        assert again.returncode == 0, again.stderr[-3000:]
        assert len(llm.chat_requests) == 2  # nothing asked twice
    folder = next((tmp_path / "run" / "evals").glob("val_*"))
    meta = json.loads((folder / "metadata.json").read_text())
    assert meta["rollouts"] == 2 and meta["errors"] == 0 and meta["reused_rollouts"] == 2
    rows = [json.loads(line) for line in (folder / "rollouts.jsonl").read_text().splitlines()]
    correct = sum(JournalRow.model_validate(r).correct for r in rows)
    assert correct == 1
    for k in (1, 2):
        assert meta["pass_at_k"][str(k)] == pytest.approx(pass_at_k(2, correct, k))
        assert meta["pass_all_k"][str(k)] == pytest.approx(pass_all_k(2, correct, k))


async def test_gepa_evolves_the_system_prompt_the_episodes_receive(
    tmp_path: Path, arith, closing
) -> None:
    """GEPA on a verifiers scenario with a scripted reflector on loopback: the reflection
    reads the rubric's feedback, and the proposed prompt reaches verifiers' episodes as the
    task's system prompt (the system message the policy receives)."""
    from art_rlvr.gepa.config import GEPAConfig
    from art_rlvr.gepa.optimizer import optimize_prompt

    closing(arith)
    better = "Add the two numbers. Reply with the sum only."
    reply = Step.reply(f"Improved:\n```\n{better}\n```")
    with (
        pytest.MonkeyPatch.context() as patch,
        ScriptedServer([], default=reply) as reflector,
        ScriptedServer([], default=Step.reply("3")) as policy,
    ):
        patch.setenv("SCRIPTED_VF_KEY", "k")
        config = GEPAConfig(
            reflection={"model": "openai/scripted", "api_base": reflector.base_url,
                        "api_key_env": "SCRIPTED_VF_KEY", "timeout_s": 5.0},
            max_metric_calls=24, pareto_size=2, traces_per_iteration=2, group_size=1,
            max_iterations=1, report_val_limit=0,
        )  # fmt: skip
        result = await optimize_prompt(
            scripted_model(policy), arith, config=config, run_dir=tmp_path / "gepa"
        )
        asked = json.dumps(reflector.chat_requests[0].body)
        systems = {r.body["messages"][0]["content"] for r in policy.chat_requests}
    assert "correct=0 (weight 1)" in asked or "correct=1 (weight 1)" in asked
    assert systems == {"Reply with only the number.", better}
    assert result.seed_prompt == "Reply with only the number."


def test_docs_show_the_example_verbatim() -> None:
    """docs/verifiers.md's example is the files the docs' commands run, so it cannot go stale."""
    examples = Path(__file__).resolve().parents[2] / "docs" / "examples" / "verifiers"
    docs = (examples.parents[1] / "verifiers.md").read_text()
    for name in ("arith_vf.py", "arith_vf.toml"):
        assert (examples / name).read_text() in docs, f"docs/verifiers.md lacks {name}"


async def test_expert_iteration_hints_reach_the_task_and_relabel_clean(
    arith, make_model, closing
) -> None:
    """A round of EI on the verifiers taskset with the embedded model and a scripted teacher on
    loopback: the teacher reads the gold answer at `data.answer`, the hint reaches every hinted
    episode as the task's system prompt, and each relabelled episode (what a correct one
    distils) carries the clean prompt and no trace of the hint."""
    from art_rlvr.core.outcome import turns
    from art_rlvr.ei.config import EIConfig
    from art_rlvr.ei.expert import collect_round
    from art_rlvr.ei.hints import make_teacher
    from art_rlvr.ei.relabel import relabel_hinted_episode
    from art_rlvr.llm.client import LLMCounters

    closing(arith)
    model = await make_model("vf-ei")
    hint = "Marker-V3 combine both digits"
    clean = "Reply with only the number."
    with (
        pytest.MonkeyPatch.context() as patch,
        ScriptedServer([], default=Step.reply(hint)) as server,
    ):
        patch.setenv("SCRIPTED_VF_KEY", "k")
        config = EIConfig(
            scenarios_per_round=4, group_size=1, hinted_samples_per_x=2, max_tokens=12,
            enable_teacher_hints=True, answer_field="data.answer",
            teacher={"model": "openai/scripted", "api_base": server.base_url,
                     "api_key_env": "SCRIPTED_VF_KEY", "timeout_s": 5.0, "max_retries": 0},
        )  # fmt: skip
        teacher, _ = make_teacher(model, config, LLMCounters())
        output = await collect_round(model, arith, config, 0, teacher=teacher)
        asked = [r.body for r in server.chat_requests]
    stats = output.buffer.stats
    unsolved = stats.scenarios - stats.clean_solved
    assert unsolved >= 1 and stats.hints_generated == unsolved == len(asked)
    by_id = {sc.id: sc for sc in arith.splits["train"]}
    told = sorted(re.findall(r"do NOT reveal it\): (\d+)", json.dumps(asked)))
    hinted_ids = [g.trajectories[0].metadata["scenario_id"] for g in output.hinted_groups]
    assert told == sorted(by_id[i].x["data"]["answer"] for i in hinted_ids)
    hinted = [t for g in output.hinted_groups for t in g.trajectories]
    assert len(hinted) == 2 * unsolved and stats.hinted_unrelabelled == 0
    for t in hinted:
        assert turns(t)[0] == {"role": "system", "content": f"{clean}\n\nHint: {hint}"}
        scenario = by_id[t.metadata["scenario_id"]]
        relabelled = relabel_hinted_episode(scenario, None, t, hint)
        assert relabelled is not None and turns(relabelled)[0]["content"] == clean
        assert turns(relabelled)[1:] == turns(t)[1:] and "Marker-V3" not in json.dumps(
            turns(relabelled)
        )
