import subprocess
import sys

import pytest
from pydantic import ValidationError

from art_rlvr.config.run_config import ConfigError, RunConfig, parse_args
from art_rlvr.ei.config import EIConfig
from art_rlvr.gepa.config import GEPAConfig


def test_defaults_and_coercion() -> None:
    cfg = parse_args(
        [
            "scenario=arith",
            "n_batches=3",
            "learning_rate=1e-4",
            "resume=false",
            "source.max_value=30",
            "source.ops=+,-",
        ]
    )
    assert cfg.rl.n_batches == 3 and cfg.rl.learning_rate == 1e-4 and cfg.resume is False
    assert cfg.source_overrides == {"max_value": 30, "ops": ["+", "-"]}
    assert cfg.name == "arith-rl-s0"


def test_rl_keys_are_the_rl_section_under_either_spelling() -> None:
    """`learning_rate=` (as ever) and `rl.learning_rate=` are the rl section's one key;
    config.json keeps the section's keys where it has always had them."""
    flat = parse_args(["learning_rate=1e-3", "n_batches=4", "patience=2"])
    dotted = parse_args(["rl.learning_rate=1e-3", "rl.n_batches=4", "rl.patience=2"])
    assert flat.rl == dotted.rl and dotted.rl.learning_rate == 1e-3 and flat.plan == dotted.plan
    assert RunConfig(n_batches=4, learning_rate=1e-3, patience=2).rl == flat.rl
    dumped = flat.public_dump()
    assert dumped["learning_rate"] == 1e-3 and dumped["n_batches"] == 4 and "rl" not in dumped
    with pytest.raises(ConfigError, match="given twice"):
        parse_args(["learning_rate=1e-3", "rl.learning_rate=2e-3"])
    with pytest.raises(ConfigError, match=r"unknown key 'rl.lerning_rate' \(did you mean"):
        parse_args(["rl.lerning_rate=1e-3"])


def test_gepa_keys_go_to_the_gepa_config_and_run_keys_are_handed_down() -> None:
    cfg = parse_args(
        ["mode=gepa", "seed=7", "max_tokens=12", "max_metric_calls=90", "use_merge=true"]
    )
    assert cfg.gepa.max_metric_calls == 90 and cfg.gepa.use_merge is True
    assert (cfg.gepa.seed, cfg.gepa.max_tokens) == (7, 12)
    assert "gepa" in cfg.public_dump() and "gepa" not in parse_args([]).public_dump()


@pytest.mark.parametrize(
    ("words", "gepa", "ei"),
    [
        ({}, (0, 2, 32), (0, 6, 32)),  # each phase's own defaults
        ({"seed": 3, "group_size": 4}, (3, 4, 32), (3, 4, 32)),
        ({"seed": 3, "max_tokens": 12, "gepa.seed": 9}, (9, 2, 12), (3, 6, 12)),
        ({"group_size": 4, "ei.group_size": 8, "gepa.group_size": 3}, (0, 3, 32), (0, 8, 32)),
    ],
)
def test_run_keys_reach_the_phase_sections_from_python_as_from_the_cli(words, gepa, ei) -> None:
    """A run key a phase also has sets it there unless the phase's own key does: the same
    config from `key=value` words and from `RunConfig(...)` in a notebook."""
    argv = ["mode=gepa_rl_ei", *(f"{k}={v}" for k, v in words.items())]
    python: dict[str, object] = {"mode": "gepa_rl_ei"}
    for key, value in words.items():
        section, dot, field = key.partition(".")
        if dot:
            python.setdefault(section, {})[field] = value  # type: ignore[index]
        else:
            python[key] = value
    for cfg in (parse_args(argv), RunConfig.model_validate(python)):
        assert (cfg.gepa.seed, cfg.gepa.group_size, cfg.gepa.max_tokens) == gepa
        assert (cfg.ei.seed, cfg.ei.group_size, cfg.ei.max_tokens) == ei
    assert parse_args(argv).public_dump() == RunConfig.model_validate(python).public_dump()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["nbatches=3"], "unknown key 'nbatches' (did you mean 'n_batches'?)"),
        (["mode=fly"], "bad value for 'mode'"),
        (["learning_rate=abc"], "bad value for 'learning_rate'"),
        (["learning_rate=-1"], "greater than 0"),
        (["group_size=1"], "group_size must be >= 2 for mode=rl"),
        (["n_batches"], "expected key=value"),
        (["seed=1", "seed=2"], "given twice"),
        (["run_name=../x"], "plain folder name"),
        (["learning_rate=nan"], "bad value for 'learning_rate'"),
        (["mode=gepa", "max_metric_calls=0"], "bad value for 'max_metric_calls'"),
        (["max_metric_cals=5"], "did you mean 'max_metric_calls'"),
        (["reflection.api_base=http://127.0.0.1:1/v1"], "api_base needs model"),
        (["teacher.api_base=http://127.0.0.1:1/v1"], "api_base needs model"),
        (["reflection.bogus=1"], "unknown key 'reflection.bogus'"),
        (["group_size=3", "group_size=4"], "given twice"),
        (["mode=eval", "eval_samples=4"], "eval_samples=4 with eval_temperature=0"),
        (["mode=eval", "eval_samples=0"], "bad value for 'eval_samples'"),
        (
            ["mode=eval", "eval_samples=2", "eval_temperature=1", "eval_k=1,3"],
            "every k must be in 1..eval_samples=2",
        ),
        (["mode=rl", "policy.model=openai/x"], "it needs mode=eval or mode=gepa, not rl"),
        (["mode=eval", "policy.api_base=http://127.0.0.1:1/v1"], "need policy.model"),
        (["mode=eval", "policy.api_key=sk-x"], "unknown key 'policy.api_key'"),
        (["mode=eval", "policy.modle=x"], "did you mean 'policy.model'"),
    ],
)
def test_bad_config_is_one_clear_line(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_args(argv)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["bogus=1"], "unknown key 'bogus'"),
        (["scenario=nope", "mode=eval"], "unknown scenario 'nope'"),
        (["temperature=hot"], "bad value for 'temperature'"),
    ],
)
def test_cli_bad_config_exits_2_without_traceback(args: list[str], message: str, tmp_path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "art_rlvr.run", *args, f"run_dir={tmp_path / 'r'}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        # one name per concept: a name renamed in 0.1 is refused with the name it has now
        (["mode=gepa", "rollouts_per_problem=3"], "rollouts_per_problem was renamed group_size"),
        (["mode=ei", "expert_samples_per_x=4"], "write group_size=4"),
        (["mode=gepa_rl", "n_rounds=2"], "n_rounds was renamed rounds: write rounds=2"),
        (["mode=gepa", "reflection_model=openai/m"], "was renamed reflection.model"),
        (["mode=ei", "teacher_timeout_s=7"], "write teacher.timeout_s=7"),
    ],
)
def test_renamed_keys_are_refused_with_their_new_name(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as error:
        parse_args(argv)
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("model", "given", "message"),
    [
        (EIConfig, {"expert_samples_per_x": 3}, "EIConfig: expert_samples_per_x was renamed"),
        (GEPAConfig, {"reflection_model": "openai/m"}, "was renamed reflection.model"),
        (RunConfig, {"n_rounds": 2}, "RunConfig: n_rounds was renamed rounds"),
    ],
)
def test_the_python_api_refuses_renamed_keys_too(model, given: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        model(**given)


def test_llm_roles_share_one_model_and_keep_their_defaults() -> None:
    config = parse_args(["mode=gepa_rl_ei", "reflection.model=openai/r", "teacher.model=openai/t"])
    assert type(config.gepa.reflection) is type(config.ei.teacher)
    assert config.gepa.reflection.model == "openai/r" and config.gepa.reflection.max_tokens == 1024
    assert config.ei.teacher.model == "openai/t" and config.ei.teacher.max_tokens == 256


def test_run_keys_are_handed_down_only_when_given() -> None:
    default = parse_args(["mode=gepa_rl_ei"])
    assert (default.group_size, default.gepa.group_size, default.ei.group_size) == (6, 2, 6)
    given = parse_args(["mode=gepa_rl_ei", "group_size=4", "seed=3"])
    assert (given.gepa.group_size, given.ei.group_size) == (4, 4)
    own = parse_args(["mode=gepa_rl_ei", "group_size=4", "gepa.group_size=1"])
    assert (own.group_size, own.gepa.group_size, own.ei.group_size) == (4, 1, 4)
    assert (given.gepa.seed, given.ei.seed) == (3, 3)


def test_policy_keys_and_pass_at_k_defaults() -> None:
    cfg = parse_args(
        [
            "mode=eval",
            "policy.model=openai/my-model",
            "policy.api_base=http://127.0.0.1:8000/v1",
            "policy.api_key_env=MY_KEY",
            "policy.max_in_flight=2",
            "eval_samples=8",
            "eval_temperature=0.7",
        ]
    )
    assert (cfg.policy.model, cfg.policy.api_key_env, cfg.policy.max_in_flight) == (
        "openai/my-model",
        "MY_KEY",
        2,
    )
    assert cfg.pass_ks == (1, 8)
    assert parse_args(
        ["mode=eval", "eval_samples=4", "eval_temperature=1", "eval_k=4,2"]
    ).pass_ks == (
        2,
        4,
    )
    # the variable's name is what config.json shows (a reader needs it); there is no value
    assert cfg.public_dump()["policy"]["api_key_env"] == "MY_KEY"
    assert parse_args([]).policy.model is None


def test_the_config_validates_without_importing_the_heavy_stack() -> None:
    """A bad key must fail in a second or two: the config imports neither ART nor torch."""
    import subprocess
    import sys

    probe = "import sys, art_rlvr.config.run_config; print(sorted({'art', 'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


NO_KEY = "ART_RLVR_TEST_UNSET_KEY"  # an API key variable no environment sets

# fmt: off
# A newcomer's first commands: each answers at once, in one or a few lines, naming the closest
# valid choice rather than listing everything, with no traceback and no run folder left behind.
FIRST_CONTACT = [
    (["--help"], 0, ["modes (mode=", "rl (default)", "scenario=arith", "docs/cli.md"]),
    (["-h"], 0, ["modes (mode=", "main keys"]),
    (["help"], 0, ["modes (mode="]),
    (["mode=gepa", "--help"], 0, ["mode=gepa: GEPA", "max_metric_calls=400", "reflection.model="]),
    (["mode=ei", "-h"], 0, ["enable_teacher_hints=false", "teacher.model="]),
    (["mode=evl", "--help"], 2, ["no mode 'evl'; one of eval, rl"]),
    (["lerning_rate=1e-3"], 2, ["(did you mean 'learning_rate'?); every key: python -m art_rlvr.run --help"]),
    (["mode=evl"], 2, ["'evl' (did you mean 'eval'?); one of eval, rl, gepa, ei, gepa_rl, gepa_rl_ei"]),
    (["scenario=arth"], 2, ["unknown scenario 'arth' (did you mean 'arith'?)"]),
    (["arith"], 2, ["(did you mean scenario=arith?)"]),
    (["source.max_vaule=3"], 2, ["source.max_vaule=3 (command line): no such key (did you mean 'max_value'?)"]),
    (["source.type=jsnl"], 2, ["source.type=jsnl (command line): 'jsnl' is no source type (did you mean 'jsonl'?)"]),
    (["mode=ei", "ei.search_tool_choice=multiply"], 2, ["mode=ei: ei.search_tool_choice: tool_choice 'multiply'"]),
    (["mode=gepa", "pareto_size=500"], 2, ["GEPA needs more than pareto_size=500"]),
    (["mode=gepa", "max_metric_calls=10"], 2, ["cannot even score the seed prompt on the Pareto set (16 calls"]),
    (["weave_offline=true"], 2, ["weave_offline=true needs weave_project=entity/project"]),
    (["mode=gepa", "reflection.model=openai/gpt-4o", f"reflection.api_key_env={NO_KEY}"], 2, [f"mode=gepa: reflection.model 'openai/gpt-4o' needs {NO_KEY} in the environment"]),
    (["mode=ei", "enable_teacher_hints=true", "teacher.model=openai/gpt-4o", f"teacher.api_key_env={NO_KEY}"], 2, [f"mode=ei: teacher.model 'openai/gpt-4o' needs {NO_KEY}"]),
    (["base_model=/no/such/folder"], 2, ["base_model=/no/such/folder: no such folder (give a Hugging Face model folder, a hub id"]),
    (["base_model=embedded:SmolLM3"], 2, ["no such embedded model; known: embedded:SmolLM2-135M-Instruct"]),
    (["base_model=no-such-org/no-such-model"], 2, ["not in the Hugging Face cache, and HF_HUB_OFFLINE is set"]),  # conftest sets it
]
# fmt: on


@pytest.mark.parametrize(
    ("args", "code", "expected"), FIRST_CONTACT, ids=[" ".join(a) for a, _, _ in FIRST_CONTACT]
)
def test_first_contact_is_short_and_exact(
    args: list[str], code: int, expected: list[str], tmp_path
) -> None:
    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "art_rlvr.run", *args, f"run_dir={run_dir}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    out = proc.stdout if code == 0 else proc.stderr
    assert proc.returncode == code, proc.stderr[-2000:]
    assert all(text in out for text in expected), out
    assert "Traceback" not in proc.stderr and not run_dir.exists()
    if code:  # one line, and not the list of every key (it used to be ~1,800 characters)
        assert out.startswith("error: ") and out.count("\n") == 1 and len(out) < 400, out
    if "source.max_vaule=3" in args:  # the command line set it: the TOML is not blamed
        assert "arith.toml" not in out


@pytest.mark.parametrize("mode", ["eval", "rl", "gepa", "ei", "gepa_rl", "gepa_rl_ei"])
def test_every_mode_has_help_naming_real_keys(mode: str) -> None:
    """Each key a mode's help shows parses with the default it shows."""
    from art_rlvr.config.reference import help_text

    text = help_text(mode)
    keys = [line.split()[0] for line in text.splitlines() if line.startswith("  ") and "=" in line]
    assert len(keys) >= 5, text
    for word in keys:
        key, _, default = word.partition("=")
        if default not in ("none", "...") and not key.startswith("policy."):
            parse_args([f"mode={mode}", word])
