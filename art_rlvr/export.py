"""`python -m art_rlvr.export runs/<run> --out <dir> [--step N]`: a run's model, outside art_rlvr.

A run keeps its weights as LoRA checkpoints in ART's layout (`.art/<project>/models/<name>/
checkpoints/<step>/`). Other tools want one plain Hugging Face folder, so this merges the chosen
adapter into the base weights and writes safetensors, config (dtype recorded), tokenizer, chat
template (the run's `chat_template` setting, else the base tokenizer's) and generation config:
`AutoModelForCausalLM` / `AutoTokenizer` load it and vLLM serves it, with no custom code. The
default step is the one with the best recorded val accuracy; `art_rlvr_export.json` says which
step, why, and the system prompt it was scored with.

Runs of every mode and of the torch and local backends have such checkpoints; serverless and
tinker runs keep their weights on the provider's side, which the error says.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from art_rlvr.core.art_layout import checkpoint_dir, list_steps
from art_rlvr.core.text import first_line
from art_rlvr.rundir.reader import RunFolder, RunFolderError, read_run_folder

if TYPE_CHECKING:
    import torch
    from transformers import GenerationConfig, PretrainedConfig, PreTrainedTokenizerBase

MANIFEST = "art_rlvr_export.json"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
_REMOTE_BACKENDS = {
    "serverless": "backend=serverless keeps its checkpoints on W&B",
    "tinker": "backend=tinker keeps its weights on Tinker's service",
}


class ExportError(RuntimeError):
    """A run or an output folder that cannot be used; one line, exit status 2."""


class MergedModel(Protocol):
    """What export uses of the merged transformers model (peft's `merge_and_unload` is
    untyped)."""

    @property
    def config(self) -> PretrainedConfig: ...

    @property
    def generation_config(self) -> GenerationConfig: ...

    def to(self, dtype: torch.dtype, /) -> MergedModel: ...

    def save_pretrained(self, save_directory: Path, /) -> None: ...


class ValEval(BaseModel):
    """One recorded val evaluation: the model step it scored and the prompt it used."""

    model_config = ConfigDict(frozen=True)

    step: int
    accuracy: float
    system_prompt: str | None = None


class Checkpoint(BaseModel):
    """The checkpoint of a run that export and serve use, and why that one."""

    model_config = ConfigDict(frozen=True)

    run: Path
    model_dir: Path
    step: int
    base_model: str
    reason: str
    val_accuracy: float | None = None
    system_prompt: str | None = None
    chat_template: str | None = None  # the run's `chat_template` (text); None: the tokenizer's

    @property
    def folder(self) -> Path:
        return checkpoint_dir(self.model_dir, self.step)

    @property
    def name(self) -> str:
        """The model's name in the run (ART's storage name), served as `<name>@<step>`."""
        return self.model_dir.name

    @property
    def project(self) -> str:
        return self.model_dir.parent.parent.name

    def adapter_config(self) -> dict[str, Any]:
        """The checkpoint's adapter_config.json as peft wrote it (read by key, unvalidated)."""
        return json.loads((self.folder / "adapter_config.json").read_text())


# ---------------------------------------------------------------------------- choosing a step
def pick_step(
    evals: Sequence[ValEval], steps: Sequence[int], requested: int | None = None
) -> tuple[int, str]:
    """The step to use and why: `requested`, else the best val accuracy among steps still on
    disk (the later step on a tie: more training for the same score), else the latest."""
    if requested is not None:
        return requested, "as asked"
    scored = [e for e in evals if e.step in steps]
    if not scored:
        return max(steps), "the latest; no val evaluation of a step on disk is recorded"
    best = max(scored, key=lambda e: (e.accuracy, e.step))
    return best.step, f"the best of {len(scored)} val evaluation(s)"


def val_evals(run: RunFolder) -> list[ValEval]:
    """Every val evaluation of the run by model step. Expert-iteration runs written before
    evaluations carried their round numbered them by round; their state maps each round to the
    model step it scored."""
    round_steps = run.eval_steps if run.mode == "ei" else None
    out = []
    for e in run.val_evals:
        old_ei = round_steps is not None and e.round is None
        step = round_steps.get(str(e.step)) if old_ei and round_steps else e.step
        if isinstance(step, int):
            out.append(ValEval(step=step, accuracy=e.accuracy, system_prompt=run.eval_prompt(e)))
    return out


def _model_dir(run: Path, config: Mapping[str, object]) -> Path | None:
    """The run's ART model folder: the only one under `.art`, else the one the config names."""
    found = sorted(p for p in (run / ".art").glob("*/models/*") if p.is_dir())
    if len(found) <= 1:
        return found[0] if found else None
    name, project = _run_model_name(config)
    named = [p for p in found if p.name == name and p.parent.parent.name == project]
    if len(named) != 1:
        raise ExportError(
            f"{run} holds several models ({', '.join(str(p.relative_to(run)) for p in found)})"
        )
    return named[0]


def _run_model_name(config: Mapping[str, object]) -> tuple[str | None, str | None]:
    """(model name, project) as the run named them (`RunConfig.name`)."""
    from art_rlvr.config.run_config import RunConfig

    keys = ("scenario", "mode", "phases", "seed", "run_name", "project")
    try:
        cfg = RunConfig.model_validate({k: config[k] for k in keys if config.get(k) is not None})
    except ValueError:
        name, project = config.get("run_name"), config.get("project")
        return _text(name), _text(project)
    return cfg.name, cfg.project


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _read_run(run: Path) -> RunFolder:
    if not run.is_dir() or not (run / "config.json").is_file():
        why = "no such folder" if not run.exists() else "no config.json in it"
        raise ExportError(
            f"{run} is not a run folder ({why}); pass the folder a run wrote, e.g. runs/arith-rl-s0"
        )
    try:
        folder = read_run_folder(run)
    except RunFolderError as error:  # a config.json or summary.json that is no JSON
        raise ExportError(str(error)) from None
    if not folder.config:
        raise ExportError(f"{run / 'config.json'} is not a run configuration")
    return folder


def _unscored_prompt(run: RunFolder) -> str | None:
    """The prompt for a step no val evaluation scored: a GEPA run's best (its weights never
    change, the prompt is what it made), else the configured one."""
    summary = run.summary
    best = (summary.best_prompt or summary.final_prompt) if summary is not None else None
    return best or run.config.get("system_prompt")


def find_checkpoint(run: Path, step: int | None = None) -> Checkpoint:
    """The checkpoint of `run` at `step`, or at its best val accuracy; `ExportError` if none."""
    folder = _read_run(run)
    config = folder.config
    backend = str(config.get("backend") or "torch")
    model_dir = _model_dir(run, config)
    steps = list_steps(model_dir) if model_dir else []
    if model_dir is None or not steps:
        why = _REMOTE_BACKENDS.get(backend, "the run stopped before its model was registered?")
        raise ExportError(f"{run} has no checkpoints ({why})")
    if step is not None and step not in steps:
        raise ExportError(
            f"{run} has no checkpoint for step {step}; steps on disk: {', '.join(map(str, steps))}"
        )
    evals = val_evals(folder)
    chosen, reason = pick_step(evals, steps, step)
    scored = [e for e in evals if e.step == chosen]
    best = max(scored, key=lambda e: e.accuracy) if scored else None
    prompt = best.system_prompt if best else _unscored_prompt(folder)
    checkpoint = Checkpoint(
        run=run,
        model_dir=model_dir,
        step=chosen,
        base_model=str(config.get("base_model") or ""),
        reason=reason,
        val_accuracy=best.accuracy if best else None,
        system_prompt=prompt,
        chat_template=config.get("chat_template") or None,
    )
    missing = [name for name in ADAPTER_FILES if not (checkpoint.folder / name).is_file()]
    if missing:
        why = _REMOTE_BACKENDS.get(backend, "an incomplete or foreign checkpoint")
        raise ExportError(f"{checkpoint.folder} has no {' or '.join(missing)} ({why})")
    if not checkpoint.base_model:
        checkpoint = checkpoint.model_copy(
            update={"base_model": checkpoint.adapter_config().get("base_model_name_or_path", "")}
        )
    base = checkpoint.base_model
    if base.startswith(("/", ".", "~")) and not Path(base).expanduser().exists():
        raise ExportError(f"the run's base model folder {base} is gone (moved or deleted?)")
    return checkpoint


# ---------------------------------------------------------------------------- writing a folder
def check_out_dir(out: Path, run: Path, *, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} is a file; --out takes a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ExportError(f"{out} is not empty; pass --force to replace it")
    if force and run.resolve().is_relative_to(out.resolve()):
        raise ExportError(f"--out {out} holds the run itself; choose another folder")


def _package_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


def _eos_ids(model: MergedModel, tokenizer: PreTrainedTokenizerBase) -> int | list[int]:
    """The ids TorchBackend stops on (generation config's and the tokenizer's end tokens), so
    transformers' `generate` and vLLM stop where the run's own server did."""
    found = model.generation_config.eos_token_id
    ids = set(found if isinstance(found, list) else [found] if found is not None else [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids.pop() if len(ids) == 1 else sorted(ids)


def _portable(folder: Path) -> None:
    """Keys that readers built on transformers 4 need: they ignore `rope_parameters` (and fall
    back to a default rope_theta: silently wrong outputs) and do not know `TokenizersBackend`,
    which is transformers 5's name for `PreTrainedTokenizerFast`. transformers 5 reads both."""
    config_path, tokenizer_path = folder / "config.json", folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope and "rope_theta" not in config:
        config["rope_theta"] = rope["rope_theta"]
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer_path.is_file():
        tokenizer = json.loads(tokenizer_path.read_text())
        if tokenizer.get("tokenizer_class") == "TokenizersBackend":
            tokenizer["tokenizer_class"] = "PreTrainedTokenizerFast"
            tokenizer_path.write_text(json.dumps(tokenizer, indent=2) + "\n")


def _readable(folder: Path) -> None:
    """The modes a plain `mkdir` and `open` would give (the temporary folder starts private),
    so another user or a serving container can read the export."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for path in folder.iterdir():
        path.chmod(0o666 & ~umask)


def merged_model(checkpoint: Checkpoint) -> tuple[MergedModel, PreTrainedTokenizerBase]:
    """The base model with the checkpoint's LoRA merged in (fp32 on CPU), and its tokenizer."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from art_rlvr.backend import resolve_base_model

    try:
        path = resolve_base_model(checkpoint.base_model)
        tokenizer = AutoTokenizer.from_pretrained(path)
        base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    except (OSError, ValueError) as error:
        raise ExportError(
            f"cannot load base model {checkpoint.base_model!r}: {first_line(error)}"
        ) from None
    if checkpoint.chat_template is not None:  # the run's template: the exported one renders
        tokenizer.chat_template = checkpoint.chat_template  # as the run served and trained
    peft = PeftModel.from_pretrained(base, str(checkpoint.folder), is_trainable=False)
    merged: MergedModel = peft.merge_and_unload()
    return merged, tokenizer


def _target_dtype(model: MergedModel, dtype: Dtype) -> torch.dtype:
    import torch

    if dtype != "auto":
        return getattr(torch, dtype)
    stored = getattr(model.config, "dtype", None)  # the base model's own dtype
    return stored if isinstance(stored, torch.dtype) else torch.float32


def export(
    checkpoint: Checkpoint, out: Path, *, dtype: Dtype = "auto", force: bool = False
) -> dict[str, object]:
    """Write the merged model to `out` (built beside it, then renamed into place: a failed
    export leaves no half folder). Returns the manifest, also saved as `art_rlvr_export.json`."""
    check_out_dir(out, checkpoint.run, force=force)
    model, tokenizer = merged_model(checkpoint)
    target = _target_dtype(model, dtype)
    model = model.to(target)
    model.config.dtype = target
    model.generation_config.eos_token_id = _eos_ids(model, tokenizer)
    if model.generation_config.pad_token_id is None and tokenizer.pad_token_id is not None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    adapter = checkpoint.adapter_config()
    manifest = {
        "run": str(checkpoint.run),
        "model": checkpoint.name,
        "project": checkpoint.project,
        "step": checkpoint.step,
        "chosen_as": checkpoint.reason,
        "val_accuracy": checkpoint.val_accuracy,
        "system_prompt": checkpoint.system_prompt,
        "base_model": checkpoint.base_model,
        "dtype": str(target).removeprefix("torch."),
        "chat_template": bool(tokenizer.chat_template),
        "chat_template_from": "the run's chat_template setting"
        if checkpoint.chat_template is not None
        else "the base model's tokenizer",
        "lora": {k: adapter.get(k) for k in ("r", "lora_alpha", "target_modules")},
        "versions": {p: _package_version(p) for p in ("art-rlvr", "transformers", "peft", "torch")},
    }
    with staged(out) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, default=str) + "\n")
        _portable(tmp)
        _readable(tmp)
    return manifest


@contextlib.contextmanager
def staged(out: Path) -> Iterator[Path]:
    """A folder next to `out` to write into; renamed to `out` (replacing it) when the block
    ends well, removed when it fails, so a failed export leaves no half folder."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.export-", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------------------- command line
def cli_parser(
    prog: str,
    description: str,
    example_run: str,
    options: Callable[[argparse.ArgumentParser], None],
) -> argparse.ArgumentParser:
    """An export command's parser: the run folder and --out, the command's own `options`,
    then --force."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("run", type=Path, help=f"the run folder, e.g. {example_run}")
    parser.add_argument("--out", type=Path, required=True, help="the folder to write")
    options(parser)
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out")
    return parser


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--step", type=int, help="the checkpoint step (default: best val)")
    parser.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
        default="auto",
        help="weights' dtype (default: the base model's own)",
    )


def _parser() -> argparse.ArgumentParser:
    return cli_parser(
        "python -m art_rlvr.export",
        "Write a run's checkpoint as a merged Hugging Face model folder.",
        "runs/arith-rl-s0",
        _options,
    )


def summary_lines(manifest: Mapping[str, object], out: Path) -> list[str]:
    acc = manifest["val_accuracy"]
    lines = [
        f"exported {manifest['model']} step {manifest['step']} ({manifest['chosen_as']}) to {out}",
        f"  base {manifest['base_model']}, dtype {manifest['dtype']}"
        + (f", val accuracy {acc:.3f}" if acc is not None else ""),
        f"  load: AutoModelForCausalLM.from_pretrained('{out}'); serve: vllm serve {out}",
    ]
    if manifest["system_prompt"]:
        lines.append(f"  system prompt it was scored with: in {out / MANIFEST}")
    if not manifest["chat_template"]:
        lines.append("  warning: the tokenizer has no chat template; clients must send raw prompts")
    return lines


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        checkpoint = find_checkpoint(args.run, args.step)
        check_out_dir(args.out, args.run, force=args.force)  # before the slow merge
        manifest = export(checkpoint, args.out, dtype=args.dtype, force=args.force)
    except ExportError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("\n".join(summary_lines(manifest, args.out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
