import json
from pathlib import Path

import pytest

from art_rlvr import load_scenario
from art_rlvr.scenarios.scenario import builtin_scenarios
from art_rlvr.scenarios.sources import ScenarioFileError


def ids(scenario, split):
    return [s.id for s in scenario.splits[split]]


def test_arith_splits_are_disjoint_and_sized() -> None:
    scenario = load_scenario("arith", seed=0)
    sets = {split: set(ids(scenario, split)) for split in ("train", "val", "test")}
    assert len(sets["val"]) == 100 and len(sets["test"]) == 100 and len(sets["train"]) == 400
    assert not sets["train"] & sets["val"] and not sets["train"] & sets["test"]
    assert not sets["val"] & sets["test"]


def test_same_seed_same_order_other_seed_other_order() -> None:
    assert ids(load_scenario("arith", seed=3), "train") == ids(
        load_scenario("arith", seed=3), "train"
    )
    assert ids(load_scenario("arith", seed=3), "train") != ids(
        load_scenario("arith", seed=4), "train"
    )


def test_arith_answers_and_no_negative_subtraction() -> None:
    scenario = load_scenario("arith", seed=0)
    for sc in scenario.splits["train"]:
        a, op, b = sc.x["a"], sc.x["op"], sc.x["b"]
        assert sc.x["answer"] == (a + b if op == "+" else a - b)
        assert sc.x["answer"] >= 0


def test_source_overrides_change_difficulty() -> None:
    scenario = load_scenario(
        "arith",
        seed=0,
        overrides={"ops": ["*"], "mul_max_value": 12, "splits": {"train": 20, "val": 5, "test": 5}},
    )
    assert {sc.x["op"] for sc in scenario.splits["train"]} == {"*"}


def test_render_uses_system_prompt_and_template() -> None:
    scenario = load_scenario("arith", seed=0)
    sc = scenario.splits["val"][0]
    messages = sc.messages("Be brief.")
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assert f"{sc.x['a']} {sc.x['op']} {sc.x['b']}" in messages[1]["content"]
    assert sc.messages("")[0]["role"] == "user"


def test_builtin_list() -> None:
    assert "arith" in builtin_scenarios()


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def user_toml(tmp_path: Path, data: str = "data.jsonl", reward: str = '"numeric"') -> Path:
    return write(
        tmp_path / "mine.toml",
        f"""
name = "mine"
user_template = "Q: {{question}}"
id_field = "qid"
[source]
type = "jsonl"
path = "{data}"
required_fields = ["question", "answer"]
splits = {{ train = 2, val = 1, test = 0 }}
[reward]
name = {reward}
""",
    )


def test_user_defined_jsonl_scenario(tmp_path: Path) -> None:
    rows = [{"qid": f"q{i}", "question": f"{i}+1?", "answer": i + 1} for i in range(3)]
    write(tmp_path / "data.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    scenario = load_scenario(str(user_toml(tmp_path)), seed=0)
    assert len(scenario.splits["train"]) == 2 and len(scenario.splits["val"]) == 1
    assert scenario.splits["val"][0].id.startswith("q")


@pytest.mark.parametrize(
    ("data", "reward", "message"),
    [
        ("missing.jsonl", '"numeric"', "data file not found"),
        ("bad.jsonl", '"numeric"', "bad.jsonl:2: not valid JSON"),
        ("nofield.jsonl", '"numeric"', "nofield.jsonl:1: missing field"),
        ("ok.jsonl", '"nonesuch"', "unknown reward 'nonesuch'"),
        ("ok.jsonl", '"no_such_module_xyz:fn"', "cannot import module"),
        ("ok.jsonl", '"json:nonesuch"', "has no attribute"),
    ],
)
def test_bad_user_scenarios_name_file_and_line(
    tmp_path: Path, data: str, reward: str, message: str
) -> None:
    write(tmp_path / "bad.jsonl", '{"question": "a", "answer": 1}\n{not json\n')
    write(tmp_path / "nofield.jsonl", '{"question": "a"}\n')
    write(tmp_path / "ok.jsonl", '{"question": "a", "answer": 1}\n')
    with pytest.raises(ScenarioFileError, match=message.replace("(", r"\(")):
        load_scenario(str(user_toml(tmp_path, data, reward)), seed=0)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name = [", "not valid TOML"),
        ('name = "x"\nuser_template = "{a}"\n[reward]\nname = "numeric"\n', "field 'source'"),
        (
            'name = "x"\nuser_template = "{a}"\nsurprise = 1\n[source]\ntype="arith"\n[reward]\nname="numeric"\n',
            "surprise",
        ),
        (
            'name = "x"\nuser_template = "{a}"\n[source]\ntype="nope"\n[reward]\nname="numeric"\n',
            "source.type: 'nope' is no source type",
        ),
        (
            'name = "x"\nuser_template = "{zzz}"\n[source]\ntype="arith"\n[reward]\nname="numeric"\n',
            "lacks field",
        ),
        (
            'name = "x"\nuser_template = "{a}"\n[source]\ntype="arith"\nmin_value=50\nmax_value=10\n[reward]\nname="numeric"\n',
            "min_value",
        ),
    ],
)
def test_malformed_scenario_files(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path / "s.toml", text)
    with pytest.raises(ScenarioFileError, match=message):
        load_scenario(str(path))


HEAD = 'name = "x"\nuser_template = "{a}"\n'


@pytest.mark.parametrize(
    ("text", "where"),
    [
        (HEAD + "surprise = 1\n[source]\ntype='arith'\n[reward]\nname='numeric'\n", ":3: "),
        (HEAD + "[source]\ntype='nope'\n[reward]\nname='numeric'\n", ":4: source.type"),
        (
            HEAD + "[source]\ntype='arith'\nmax_valu=3\n[reward]\nname='numeric'\n",
            ":5: source.max_valu",
        ),
        (
            HEAD + "[source]\ntype='arith'\n\n[reward]\nname='numerc'\n",
            ":7: unknown reward 'numerc'",
        ),
        (
            HEAD + "[source]\ntype='arith'\n[reward]\nname='qa'\nparams={bogus=1}\n",
            ":7: bad parameters",
        ),
        (HEAD + "source = {type='nope'}\nreward = {name='numeric'}\n", ":3: source.type"),
    ],
)
def test_scenario_errors_name_the_toml_line(tmp_path: Path, text: str, where: str) -> None:
    path = write(tmp_path / "s.toml", text)
    with pytest.raises(ScenarioFileError) as error:
        load_scenario(str(path))
    assert str(error.value).startswith(f"{path}{where}"), str(error.value)


def test_unknown_scenario_lists_choices() -> None:
    with pytest.raises(ScenarioFileError, match=r"unknown scenario 'nope'.*arith"):
        load_scenario("nope")


REWARDS = """
import asyncio
from art_rlvr.scenarios.rewards import Score

def as_float(x, y):
    return 1.0 if y.strip() == str(x["answer"]) else 0.0

def as_bool(x, y):
    return y.strip() == str(x["answer"])

async def as_async_float(x, y):
    await asyncio.sleep(0)
    return 0.5

def as_score(x, y):
    return Score(reward=0.0, feedback="no")

def as_text(x, y):
    return "correct"

def too_big(x, y):
    return 2.5

def raises(x, y):
    return int(y)  # an empty reply raises ValueError
"""


@pytest.fixture
def reward_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`user_rewards:<fn>` importable, and a JSONL scenario of two records that uses it."""
    write(tmp_path / "user_rewards.py", REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    rows = [{"qid": f"q{i}", "question": f"{i}+1?", "answer": i + 1} for i in range(3)]
    write(tmp_path / "data.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path


@pytest.mark.parametrize(
    ("fn", "reply", "reward", "correct"),
    [
        ("as_float", "2", 1.0, True),
        ("as_float", "7", 0.0, False),
        ("as_bool", "2", 1.0, True),  # the TRL / verifiers habit: True is 1.0 and correct
        ("as_bool", "x", 0.0, False),
        ("as_async_float", "x", 0.5, False),
        ("as_score", "2", 0.0, False),
    ],
)
async def test_a_reward_may_return_a_score_a_float_or_a_bool(
    reward_module: Path, fn: str, reply: str, reward: float, correct: bool
) -> None:
    scenario = load_scenario(str(user_toml(reward_module, reward=f'"user_rewards:{fn}"')), seed=0)
    record = next(s for split in scenario.splits.values() for s in split if s.x["answer"] == 2)
    score = await record.score(reply)
    assert (score.reward, score.correct) == (reward, correct)


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        ("as_text", "returned str; a reward returns a Score, a float in [0, 1] or a bool"),
        ("too_big", "returned 2.5; a reward's number is in [0, 1]"),
        ("raises", "raised ValueError"),
    ],
)
def test_a_reward_that_returns_no_score_is_refused_at_load(
    reward_module: Path, fn: str, message: str
) -> None:
    """Found when the scenario loads (one record, an empty reply), not after the model has
    loaded and generated: the error names the file, the line of `name` and what came back."""
    toml = user_toml(reward_module, reward=f'"user_rewards:{fn}"')
    with pytest.raises(ScenarioFileError) as error:
        load_scenario(str(toml), seed=0)
    text, lines = str(error.value), toml.read_text().splitlines()
    line = next(n for n, t in enumerate(lines, 1) if t.startswith('name = "user_rewards'))
    assert text.startswith(f"{toml}:{line}: reward 'user_rewards:{fn}'") and message in text, text
    assert "\n" not in text


def test_a_tool_scenario_leaves_room_for_a_whole_call() -> None:
    """Tool scenarios carry their own max_tokens (a call is ~30 tokens of JSON); the run takes
    it unless the command line sets one."""
    from art_rlvr.run import scenario_defaults

    for name in ("qa_search", "calc"):
        scenario = load_scenario(name)
        assert scenario.spec_max_tokens is not None and scenario.spec_max_tokens >= 48
        assert scenario_defaults([f"scenario={name}"], scenario) == [
            f"max_tokens={scenario.spec_max_tokens}"
        ]
        assert scenario_defaults([f"scenario={name}", "max_tokens=16"], scenario) == []
    assert scenario_defaults(["scenario=arith"], load_scenario("arith")) == []


@pytest.mark.parametrize(
    ("reward", "formats"), [('"user_rewards:as_bool"', False), ('"numeric"', True)]
)
async def test_an_evaluation_reports_format_only_when_the_reward_measures_it(
    reward_module: Path, reward: str, formats: bool
) -> None:
    """A user's reward without a `format` metric gets no `format 0.00` in the eval line (it
    measured nothing); the built-in numeric reward, which measures it, keeps it. Real rollouts
    against the scripted OpenAI-compatible server on loopback."""
    import art

    from art_rlvr.eval.evaluate import evaluate
    from art_rlvr.testing import ScriptedServer, Step

    scenario = load_scenario(str(user_toml(reward_module, reward=reward)), seed=0)
    examples = scenario.splits["train"] + scenario.splits["val"]
    replies = [Step.reply("2")] * len(examples)  # the rollouts run concurrently
    with ScriptedServer(replies) as server:
        model = art.Model(
            name="fmt", project="t", inference_base_url=server.base_url,
            inference_api_key="k", inference_model_name="scripted",
        )  # fmt: skip
        report = await evaluate(model, examples)
    assert report.n == len(examples) == 3 and report.errors == 0
    assert (report.format_rate is not None) == formats
    assert ("format" in report.line()) == formats, report.line()
