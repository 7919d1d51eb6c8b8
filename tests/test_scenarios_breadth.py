"""The built-in breadth scenarios (gsm8k, math, humaneval, qa), their loaders' errors, and a
user-defined scenario run end to end through the CLI."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from art_rlvr import load_scenario
from art_rlvr.rundir.stored import read_trajectories
from art_rlvr.scenarios.scenario import builtin_scenarios
from art_rlvr.scenarios.sources import ScenarioFileError, last_boxed


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def rows(path: Path, items: list[dict]) -> Path:
    return write(path, "".join(json.dumps(item) + "\n" for item in items))


def ids(scenario, split: str) -> list[str]:
    return [sc.id for sc in scenario.splits[split]]


def test_builtin_breadth_scenarios_are_listed() -> None:
    assert {"arith", "gsm8k", "math", "humaneval", "qa"} <= set(builtin_scenarios())


@pytest.mark.parametrize(
    ("name", "sizes"),
    [
        ("gsm8k", (60, 20, 20)),
        ("math", (12, 5, 5)),
        ("humaneval", (100, 32, 32)),
        ("qa", (8, 6, 6)),
    ],
)
def test_builtin_scenarios_load_with_disjoint_seeded_splits(name: str, sizes: tuple) -> None:
    scenario = load_scenario(name, seed=0)
    got = tuple(len(scenario.splits[s]) for s in ("train", "val", "test"))
    assert got == sizes
    every = [i for s in ("train", "val", "test") for i in ids(scenario, s)]
    assert len(every) == len(set(every))
    assert ids(load_scenario(name, seed=0), "val") == ids(scenario, "val")
    assert ids(load_scenario(name, seed=1), "train") != ids(scenario, "train")
    for split in scenario.splits.values():
        for sc in split:
            assert sc.messages()[-1]["content"].strip()


async def test_gsm8k_records_keep_solution_and_numeric_gold() -> None:
    scenario = load_scenario("gsm8k", seed=0)
    examples = [sc for split in scenario.splits.values() for sc in split]
    assert len(examples) == 100
    for sc in examples:
        assert sc.x["solution"] and "####" not in sc.x["solution"]
        assert sc.x["question"] in sc.messages()[-1]["content"]
        gold = sc.x["answer"]
        assert (await sc.score(f"Step by step...\nThe answer is {gold}.")).reward == 1.0
        assert (await sc.score(f"The answer is {int(float(gold)) + 1}.")).reward == 0.0


def test_gsm8k_commas_paths_and_val_carved_from_train(tmp_path: Path) -> None:
    train = [{"question": f"q{i}?", "answer": f"work\n#### 1,{i:03d}"} for i in range(10)]
    rows(tmp_path / "train.jsonl", train)
    rows(tmp_path / "test.jsonl", [{"question": "t?", "answer": "#### -2.5"}])
    toml = write(
        tmp_path / "g.toml",
        'name = "g"\nuser_template = "{question}"\n[source]\ntype = "gsm8k"\n'
        'paths = { train = "train.jsonl", test = "test.jsonl" }\nsplits = { val = 3 }\n'
        '[reward]\nname = "numeric"\n',
    )
    scenario = load_scenario(str(toml), seed=0)
    assert [len(scenario.splits[s]) for s in ("train", "val", "test")] == [7, 3, 1]
    assert sorted(sc.x["answer"] for sc in scenario.splits["val"] + scenario.splits["train"]) == [
        f"1{i:03d}" for i in range(10)
    ]
    assert scenario.splits["test"][0].x["answer"] == "-2.5"
    assert scenario.splits["test"][0].id == "test-1"  # no id in the file: stem and line


GSM8K_HUB_TOML = (
    'name = "g"\nuser_template = "{question}"\n[source]\ntype = "gsm8k"\nhub = "openai/gsm8k"\n'
    '{extra}[reward]\nname = "numeric"\n'
)
LOAD = (
    "import sys; from art_rlvr.scenarios.scenario import load_scenario; t = load_scenario(sys.argv[1], seed=0); "
    "print([len(t.splits[s]) for s in ('train', 'val', 'test')], "
    "sorted(s.x['answer'] for s in t.splits['test']))"
)


def hub_cache(root: Path) -> None:
    """A Hugging Face cache holding openai/gsm8k's parquet files, as snapshot_download leaves it."""
    import pyarrow
    import pyarrow.parquet

    repo = root / "datasets--openai--gsm8k"
    commit = "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    folder = repo / "snapshots" / commit / "main"
    folder.mkdir(parents=True)
    for split, n in (("train", 12), ("test", 4)):
        table = pyarrow.Table.from_pylist(
            [{"question": f"{split} {i}?", "answer": f"work\n#### {i}"} for i in range(n)]
        )
        pyarrow.parquet.write_table(table, folder / f"{split}-00000-of-00001.parquet")


@pytest.mark.parametrize(
    ("cached", "extra", "expected"),
    [
        (True, "splits = { val = 2 }\n", "[10, 2, 4] ['0', '1', '2', '3']"),
        (False, 'path = "local.jsonl"\n', "[1, 0, 0] []"),  # hub unreachable: local fallback
        (False, "", "cannot load 'openai/gsm8k' from the Hugging Face hub"),
    ],
)
def test_gsm8k_from_the_hub_cache_or_local_fallback(
    tmp_path: Path, cached: bool, extra: str, expected: str
) -> None:
    """The real hub code path, offline (HF_HUB_OFFLINE=1: no connection is ever made)."""
    if cached:
        hub_cache(tmp_path / "hf")
    rows(tmp_path / "local.jsonl", [{"question": "q?", "answer": "#### 7"}])
    toml = write(tmp_path / "g.toml", GSM8K_HUB_TOML.replace("{extra}", extra))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hf")}
    done = subprocess.run(
        [sys.executable, "-c", LOAD, str(toml)], env=env, capture_output=True, text=True
    )
    assert expected in done.stdout + done.stderr


def test_math_loader_takes_answer_from_last_boxed(tmp_path: Path) -> None:
    rows(
        tmp_path / "m.jsonl",
        [
            {"problem": "p", "solution": "So $\\boxed{2}$, no: $\\boxed{\\frac{1}{2}}$."},
            {"problem": "q", "solution": "text", "answer": "[2, 5)"},
        ],
    )
    toml = write(
        tmp_path / "m.toml",
        'name = "m"\nuser_template = "{problem}"\n[source]\ntype = "math"\npath = "m.jsonl"\n'
        '[reward]\nname = "math"\n',
    )
    answers = sorted(sc.x["answer"] for sc in load_scenario(str(toml), seed=0).splits["train"])
    assert answers == ["[2, 5)", "\\frac{1}{2}"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("\\boxed{3}", "3"),
        ("a \\boxed{1} b \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
        ("\\fbox{7}", "7"),
        ("\\boxed{unclosed", None),
        ("no box", None),
        ("\\boxed{}", None),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


def test_humaneval_records_come_from_the_installed_package() -> None:
    scenario = load_scenario("humaneval", seed=0)
    examples = [sc for split in scenario.splits.values() for sc in split]
    assert len(examples) == 164
    assert {sc.id for sc in examples} == {f"HumanEval/{i}" for i in range(164)}
    sc = scenario.splits["val"][0]
    assert sc.x["prompt"] in sc.messages()[-1]["content"]
    assert {"prompt", "test", "entry_point", "canonical_solution"} <= sc.x.keys()


# --- bad input: one clear error naming the file (and the line, where there is one) -----------


def scenario_file(tmp_path: Path, source: str, reward: str = 'name = "numeric"') -> Path:
    return write(
        tmp_path / "s.toml",
        f'name = "s"\nuser_template = "{{question}}"\n[source]\n{source}\n[reward]\n{reward}\n',
    )


GOOD_GSM8K = {"question": "q?", "answer": "so #### 4"}


@pytest.mark.parametrize(
    ("source", "reward", "data", "message"),
    [
        ('type = "gsm8k"\npath = "nope.jsonl"', None, None, "nope.jsonl: data file not found"),
        (
            'type = "gsm8k"\npath = "d.jsonl"',
            None,
            '{"question": "q?", "answer": "#### 1"}\n{oops\n',
            "d.jsonl:2: not valid JSON",
        ),
        (
            'type = "gsm8k"\npath = "d.jsonl"',
            None,
            '\n{"answer": "#### 1"}\n',
            "d.jsonl:2: missing or empty field(s) ['question']",
        ),
        (
            'type = "gsm8k"\npath = "d.jsonl"',
            None,
            '{"question": "q?", "answer": "no marker"}\n',
            "d.jsonl:1: field 'answer' has no '#### <number>'",
        ),
        (
            'type = "gsm8k"\npath = "d.jsonl"',
            None,
            '{"question": "q?", "answer": "#### four"}\n',
            "d.jsonl:1: final answer 'four' after '####' is not a number",
        ),
        (
            'type = "gsm8k"\npath = "d.jsonl"',
            None,
            "[1, 2]\n",
            "d.jsonl:1: expected a JSON object, got list",
        ),
        ('type = "gsm8k"', None, None, "give `path` (one JSONL file) or `paths`"),
        (
            'type = "math"\npath = "d.jsonl"',
            None,
            '{"problem": "p", "solution": "no box"}\n',
            "d.jsonl:1: no 'answer' field and no \\boxed{} answer",
        ),
        (
            'type = "humaneval"\npath = "d.jsonl"',
            None,
            '{"task_id": "t", "prompt": "p"}\n',
            "d.jsonl:1: missing or empty field(s) ['test', 'entry_point']",
        ),
        ('type = "humaneval"\npath = "d.jsonl.gz"', None, "not gzip", "d.jsonl.gz: cannot read"),
        (
            'type = "gsm8k"\npath = "d.jsonl"',
            'name = "nonesuch"',
            None,
            "unknown reward 'nonesuch'",
        ),
        (
            'type = "gsm8k"\npath = "d.jsonl"',
            'name = "no_such_module_xyz:score"',
            None,
            "cannot import module 'no_such_module_xyz'",
        ),
        (
            'type = "gsm8k"\npath = "d.jsonl"',
            'name = "art_rlvr.scenarios.rewards.qa:nonesuch"',
            None,
            "has no attribute 'nonesuch'",
        ),
        (
            'type = "gsm8k"\npath = "d.jsonl"',
            'name = "math"\nparams = { timeout_s = -1 }',
            None,
            "bad parameters for reward 'math'",
        ),
        (
            'type = "gsm8k"\npath = "d.jsonl"\nsurprise = 1',
            None,
            None,
            "source.surprise: no such key",
        ),
    ],
)
def test_bad_input_is_one_clear_error(
    tmp_path: Path, source: str, reward: str | None, data: str | None, message: str
) -> None:
    toml = scenario_file(tmp_path, source, reward or 'name = "numeric"')
    if data is not None:
        name = "d.jsonl.gz" if "jsonl.gz" in source else "d.jsonl"
        write(tmp_path / name, data)
    else:
        rows(tmp_path / "d.jsonl", [GOOD_GSM8K])
    with pytest.raises(ScenarioFileError) as caught:
        load_scenario(str(toml), seed=0)
    text = str(caught.value)
    assert message in text and "\n" not in text
    assert str(tmp_path) in text  # names the file


def test_malformed_scenario_file_names_file_and_line(tmp_path: Path) -> None:
    toml = write(tmp_path / "broken.toml", 'name = "x"\nuser_template = "{a}"\n[source\n')
    with pytest.raises(ScenarioFileError, match=r"broken\.toml: not valid TOML .*line 3"):
        load_scenario(str(toml), seed=0)


# --- a user-defined scenario, end to end through the CLI ---------------------------------------

USER_REWARD = '''
"""A user's own reward: full credit for naming the colour, in any case."""
from art_rlvr.scenarios.rewards import Score


def colour(x, y):
    hit = x["colour"].lower() in (y or "").lower()
    return Score(reward=float(hit), feedback="named it" if hit else "missed it",
                 metrics={"correct": float(hit)})
'''


def test_cli_evals_a_user_defined_scenario(tmp_path: Path) -> None:
    """A scenario written here (JSONL + TOML + its own reward module), run by the real CLI."""
    folder = tmp_path / "mine"
    folder.mkdir()
    things = [("the sky", "blue"), ("grass", "green"), ("snow", "white"), ("coal", "black")]
    rows(
        folder / "sky.jsonl",
        [{"key": f"k{i}", "thing": t, "colour": c} for i, (t, c) in enumerate(things)],
    )
    write(folder / "colour_rewards.py", USER_REWARD)
    toml = write(
        folder / "colours.toml",
        textwrap.dedent(
            """
            name = "colours"
            system_prompt = "Answer with one word."
            user_template = "What colour is {thing}?"
            id_field = "key"
            [source]
            type = "jsonl"
            path = "sky.jsonl"
            required_fields = ["thing", "colour"]
            splits = { train = 2, val = 2, test = 0 }
            [reward]
            name = "colour_rewards:colour"
            """
        ),
    )
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "art_rlvr.run",
            f"scenario={toml}",
            "mode=eval",
            "val_limit=2",
            "max_tokens=16",
            "eval_test=false",
            f"run_dir={run_dir}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(folder)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["scenario"] == "colours" and summary["mode"] == "eval"
    assert 0.0 <= summary["val_accuracy_before"] <= 1.0
    stored = read_trajectories(run_dir / "trajectories" / "val_0000.jsonl")
    assert len(stored) == 2
    assert {r.feedback for r in stored} <= {"named it", "missed it"}
    assert {r.scenario_id for r in stored} <= {"k0", "k1", "k2", "k3"}
