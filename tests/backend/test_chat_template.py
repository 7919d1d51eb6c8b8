"""Base models without a chat template: the `chat_template` setting (CLI, RunConfig and ART's own
`_internal_config`), the one-line error without it, and the export that carries it.

The base model is the embedded one with its template deleted (a real tokenizer and real weights
that cannot render a conversation), as a pretrained checkpoint converted to a folder would be.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import art
import pytest
from transformers import AutoTokenizer

from art_rlvr import DEFAULT_BASE_MODEL, RunConfig, TorchBackend
from art_rlvr.backend.adapters.model_source import declares_chat_template, resolve_base_model
from art_rlvr.config.run_config import ConfigError, parse_args
from art_rlvr.core.chat_template import PLAIN, ChatTemplateError
from art_rlvr.export import main as export_main
from art_rlvr.run import main as run_main
from art_rlvr.rundir.stored import read_trajectories

EVAL = ("mode=eval", "val_limit=6", "max_tokens=8", "eval_test=false")


@pytest.fixture(scope="module")
def bare_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded model's folder without a chat template (weights linked, not copied)."""
    source = Path(resolve_base_model(DEFAULT_BASE_MODEL))
    folder = tmp_path_factory.mktemp("bare") / "model"
    folder.mkdir()
    for path in source.iterdir():
        if path.name == "model.safetensors":
            (folder / path.name).symlink_to(path)
        elif path.name != "chat_template.jinja":
            shutil.copy(path, folder / path.name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert AutoTokenizer.from_pretrained(folder).chat_template is None
    return folder


def test_which_folders_declare_a_template(bare_model: Path, tmp_path: Path) -> None:
    with_file = tmp_path / "with_file"
    shutil.copytree(bare_model, with_file, symlinks=True)
    (with_file / "chat_template.jinja").write_text(PLAIN)
    assert declares_chat_template(DEFAULT_BASE_MODEL) is True
    assert declares_chat_template(resolve_base_model(DEFAULT_BASE_MODEL)) is True
    assert declares_chat_template(str(with_file)) is True
    assert declares_chat_template(str(bare_model)) is False
    assert declares_chat_template("SomeOrg/not-local") is None  # a hub id: known after fetching


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (None, "has no chat template; set chat_template=plain"),
        ("{% for message in messages %}", "chat_template: not a valid Jinja template (line 1"),
        ("{{ messages[7]['content'] }}", "chat_template: rendering a system + user prompt failed"),
        ("{{ bos_token }}", "chat_template: the template does not render the messages' content"),
        ("no/such/template.jinja", "chat_template='no/such/template.jinja': no such file"),
    ],
    ids=["missing", "jinja-syntax", "jinja-runtime", "drops-messages", "missing-file"],
)
def test_bad_or_missing_template_stops_at_once_with_one_line(
    bare_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], template, expected
) -> None:
    run_dir = tmp_path / "run"
    args = [f"base_model={bare_model}", f"run_dir={run_dir}", *EVAL]
    code = run_main(args + ([f"chat_template={template}"] if template else []))
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("error: ") and "\n" not in err
    assert expected in err
    assert not run_dir.exists()  # stopped before any folder, model or connection


def test_named_file_and_inline_templates_resolve_to_text(tmp_path: Path) -> None:
    path = tmp_path / "plain.jinja"
    path.write_text(PLAIN)
    assert RunConfig(chat_template="plain").chat_template == PLAIN
    assert parse_args([f"chat_template={path}"]).chat_template == PLAIN
    assert RunConfig(chat_template=PLAIN).chat_template == PLAIN  # config.json round trip
    with pytest.raises(ConfigError, match="applies to the run's own model"):
        parse_args(["mode=eval", "policy.model=openai/x", "chat_template=plain"])


@pytest.fixture(scope="module")
def plain_run(bare_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """`mode=eval` of the templateless model with `chat_template=plain`, run by the CLI's main."""
    run_dir = tmp_path_factory.mktemp("plain") / "run"
    args = [f"base_model={bare_model}", "chat_template=plain", f"run_dir={run_dir}", *EVAL]
    handlers = logging.getLogger().handlers[:]
    code = run_main(args)
    logging.getLogger().handlers[:] = handlers  # main points the root logger at run.log
    assert code == 0
    return run_dir, (run_dir / "run.log").read_text()


def test_plain_template_evaluates_the_base_model_without_errors(plain_run) -> None:
    run_dir, log = plain_run
    (event,) = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if json.loads(line)["event"] == "eval"
    ]
    assert event["errors"] == 0 and event["first_error"] is None
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["failed"] is None and summary["val_accuracy_after"] == event["accuracy"]
    config = json.loads((run_dir / "config.json").read_text())
    assert config["chat_template"] == PLAIN  # the text, so export and serve use the same
    rows = read_trajectories(run_dir / "trajectories" / "val_0000.jsonl")
    assert len(rows) == 6
    assert "val: accuracy" in log and "errored" not in log


def test_export_writes_the_runs_template(plain_run, tmp_path: Path) -> None:
    run_dir, _ = plain_run
    out = tmp_path / "exported"
    assert export_main([str(run_dir), "--out", str(out)]) == 0
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.chat_template == PLAIN
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 2?"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt == "User: What is 2 + 2?\nAssistant:"
    manifest = json.loads((out / "art_rlvr_export.json").read_text())
    assert manifest["chat_template_from"] == "the run's chat_template setting"


async def test_arts_internal_config_template_serves_and_trains(
    bare_model: Path, tmp_path: Path
) -> None:
    """The Python API without RunConfig: ART's `_internal_config` on TorchBackend, as on
    ART's LocalBackend. Serving renders with it; SFT (which renders every message) trains."""
    template_file = tmp_path / "plain.jinja"
    template_file.write_text(PLAIN)
    backend = TorchBackend(path=tmp_path / "art")
    try:

        def model(name: str, config: dict | None) -> art.TrainableModel:
            return art.TrainableModel(
                name=name,
                project="t",
                run_name=name,
                base_model=str(bare_model),
                _internal_config=config,
            )

        with pytest.raises(ChatTemplateError, match="has no chat template; set chat_template"):
            await model("none", None).register(backend)
        with pytest.raises(ChatTemplateError, match="Set only one of chat_template"):
            both = {"chat_template": PLAIN, "chat_template_path": str(template_file)}
            await model("both", both).register(backend)
        plain = model("plain", {"chat_template_path": str(template_file)})
        await plain.register(backend)
        chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
        response = await plain.openai_client().chat.completions.create(
            model=plain.get_inference_name(), messages=chat, max_tokens=4, temperature=0
        )
        ids = response.choices[0].model_extra["prompt_token_ids"]
        tokenizer = AutoTokenizer.from_pretrained(bare_model)
        assert tokenizer.decode(ids) == "System: Be brief.\nUser: Hi\nAssistant:"
        pair = art.Trajectory(
            messages_and_choices=[*chat, {"role": "assistant", "content": "Hello."}], reward=0.0
        )
        await plain.train_sft([pair], config=art.TrainSFTConfig(learning_rate=1e-5))
        assert await plain.get_step() == 1
    finally:
        await backend.close()
