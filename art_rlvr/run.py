"""`python -m art_rlvr.run scenario=arith mode=rl key=value ...`: parse, check, build, dispatch
on mode.

Everything that can reject a run is checked before ART and torch are imported (about 15 s of
CPU): keys, values, the scenario, each mode's own requirements, a user's reward. The first line
is printed then, not after the imports. Ctrl-C stops the run within a couple of seconds and
prints how to resume, last; a second Ctrl-C quits at once (the run folder is written atomically,
so nothing is lost either way).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import random
import shlex
import signal
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, cast

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # litellm must not fetch at import
os.environ.setdefault("WEAVE_DISABLED", "true")  # tracing is opt-in


if TYPE_CHECKING:
    import art

from art_rlvr.backend import BackendChoice, BackendUnavailable
from art_rlvr.config.reference import help_text
from art_rlvr.config.run_config import MODE_TITLES, ConfigError, RunConfig, parse_args
from art_rlvr.core.chat_template import ChatTemplateError
from art_rlvr.core.text import first_line
from art_rlvr.ei.config import start_problem as ei_problem
from art_rlvr.eval.policy import PolicyError, read_key
from art_rlvr.gepa.start import choose_seed_prompt
from art_rlvr.gepa.start import start_problem as gepa_problem
from art_rlvr.llm.client import key_problem
from art_rlvr.loops.evaluate import versions
from art_rlvr.loops.plan import spell
from art_rlvr.observe.clock import cpu_seconds
from art_rlvr.observe.tracing import finish_weave, setup_weave
from art_rlvr.rollouts.verifiers import load_any, runners_of
from art_rlvr.rundir.events import EvalEvent, RolloutsFailed, RunSummary
from art_rlvr.rundir.files import RunFiles, StateFileError
from art_rlvr.scenarios.environments.mcp_tools import (
    McpServerError,
    close_servers,
    servers_of,
    start_servers,
)
from art_rlvr.scenarios.mixture import Mixture
from art_rlvr.scenarios.scenario import Scenario
from art_rlvr.scenarios.sources import ScenarioFileError

log = logging.getLogger("art_rlvr")


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)


def setup_logging(cfg: RunConfig, files: RunFiles) -> None:
    root = logging.getLogger()
    root.setLevel(cfg.log_level)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
    for handler in (logging.StreamHandler(sys.stderr), logging.FileHandler(files.root / "run.log")):
        handler.setFormatter(fmt)
        root.addHandler(handler)
    for noisy in ("httpx", "LiteLLM", "litellm", "weave", "verifiers", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.captureWarnings(True)  # a library's warning reaches run.log as the console saw it


def close_logging() -> None:
    """Flush and detach run.log (and the console handler) so the lines after it are plain."""
    root = logging.getLogger()
    for handler in list(root.handlers):
        handler.close()
        root.removeHandler(handler)
    logging.captureWarnings(False)


def chosen_backend(cfg: RunConfig) -> BackendChoice:
    """The run's `backend=` with what it needs to know of the model."""
    return BackendChoice(
        name=cfg.backend,
        base_model=cfg.base_model,
        chat_template=cfg.chat_template,
        lora_rank=cfg.lora_rank,
    )


def prepare(cfg: RunConfig) -> tuple[Scenario | Mixture, RunFiles]:
    """Everything that can reject the run cheaply, before the heavy imports and before the run
    folder exists (a rejected run leaves nothing behind)."""
    scenario = load_any(cfg.scenario, seed=cfg.seed, overrides=cfg.source_overrides)
    if problem := mode_problem(cfg, scenario):
        raise ConfigError(problem)
    if cfg.policy.model is None:
        chosen_backend(cfg).check()  # before any folder
    else:
        read_key(cfg.policy)  # an external policy's key variable: before any folder or request
    if problem := machine_problem(cfg):
        raise ConfigError(problem)
    files = RunFiles(cfg.directory)
    files.read_json("state.json")  # a corrupt state file stops the run before anything starts
    if not cfg.resume and (files.root / "state.json").exists():
        raise ConfigError(f"{files.root} already holds a run; pass resume=true or a new run_name")
    return scenario, files


def mode_problem(cfg: RunConfig, scenario: Scenario | Mixture) -> str | None:
    """What each mode would refuse when it starts (asked now, before any model loads): GEPA's
    Pareto set, seed prompt and budget; expert iteration's records and search tool."""
    if not isinstance(scenario, Scenario):  # a mixture runs eval or rl only (RunConfig checks that)
        return None
    if cfg.with_gepa:
        seed_prompt = choose_seed_prompt(
            gepa=cfg.gepa.seed_prompt,
            run=cfg.system_prompt,
            scenario_default=scenario.default_system_prompt,
        )
        if problem := gepa_problem(cfg.gepa, scenario, seed_prompt):
            return f"mode={cfg.mode}: {problem}"
    if cfg.with_expert_iteration and (problem := ei_problem(cfg.ei, scenario, cfg.system_prompt)):
        return f"mode={cfg.mode}: {problem}"
    return None


def machine_problem(cfg: RunConfig) -> str | None:
    """What this machine lacks for the run, asked before anything loads: a base model that
    cannot load here, the key of an external reflection LM or teacher (litellm says which key
    a provider needs; importing it takes ~4 s, only when such a model is set)."""
    if cfg.policy.model is None and (problem := chosen_backend(cfg).base_model_problem()):
        return problem
    roles = [("reflection", cfg.gepa.reflection)] if cfg.with_gepa else []
    if cfg.with_expert_iteration and cfg.ei.enable_teacher_hints:
        roles.append(("teacher", cfg.ei.teacher))
    for name, role in roles:
        if problem := key_problem(role, name):
            return f"mode={cfg.mode}: {problem}"
    return None


async def execute(cfg: RunConfig, scenario: Scenario | Mixture, files: RunFiles) -> RunSummary:
    from art_rlvr.loops.context import RunContext
    from art_rlvr.loops.runner import run_phases

    seed_everything(cfg.seed)
    public = cfg.public_dump()  # a mode shown as its phases, each phase's own knobs
    files.write_json("config.json", {**public, "versions": versions()})
    log.info("config: %s", json.dumps(public))
    log.info("splits: %s", {k: len(v) for k, v in scenario.splits.items()})
    for note in scenario_notes(scenario, cfg.system_prompt):
        log.info("%s", note)
    log.info("threads: %s", _threads())
    tracing = setup_weave(cfg.weave_project, offline=cfg.weave_offline)
    started, cpu_started = time.monotonic(), cpu_seconds()
    prior = files.read_json("summary.json") or {}
    backend = None
    # MCP tool servers, and verifiers environments' serving contexts: each once per run
    servers: list[Any] = [
        *servers_of(t.environment for t in scenario.scenarios),
        *runners_of(scenario),
    ]
    try:
        await start_servers(servers)
        if cfg.policy.model is not None:  # an external model: no backend, no embedded model
            from art_rlvr.eval.policy import external_model

            policy = external_model(cfg.policy, project=cfg.project)
            # eval and GEPA read the model only through its client and train nothing: the same
            # phases as on the run's own model, with no backend
            trainee = cast("art.TrainableModel", policy)
            ctx = RunContext(
                cfg, scenario, cast("art.Backend", None), trainee, files, started, cpu_started
            )
            result = await run_phases(ctx)
        else:
            choice = chosen_backend(cfg)
            backend = choice.build(path=files.art_path, seed=cfg.seed)
            model = choice.trainable_model(cfg.name, cfg.project)
            await register(model, backend, cfg)
            ctx = RunContext(cfg, scenario, backend, model, files, started, cpu_started)
            result = await watched(run_phases(ctx), cfg)
    except RolloutsFailed as error:
        # a result that is really an error is the worst output: say why, in the log and in
        # summary.json, and exit non-zero (main); never an accuracy of 0.0
        log.error("run failed: %s", error)
        write_summary(files, cfg, scenario, {"failed": str(error)}, started, prior)
        raise
    finally:
        await close_servers(servers)
        if backend is not None:
            await backend.close()
        if tracing:
            finish_weave()
    return write_summary(files, cfg, scenario, result, started, prior)


async def watched[T](work: Coroutine[Any, Any, T], cfg: RunConfig) -> T:
    """`work`, stopped with one line if the self-hosted Tinker service it trains on goes away
    (its state is consistent at any moment: the same command resumes the run)."""
    if cfg.backend != "tinker" or not os.environ.get("TINKER_BASE_URL"):
        return await work
    main = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(chosen_backend(cfg).service_lost())
    try:
        await asyncio.wait({main, watch}, return_when=asyncio.FIRST_COMPLETED)
        if watch.done():  # the cause is known: the failing requests it leaves are not news
            for name in ("tinker", "uvicorn.error"):
                logging.getLogger(name).setLevel(logging.CRITICAL)
    finally:
        for task in (watch, main):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    if main.cancelled():  # the watcher won: the service went away mid-run
        raise BackendUnavailable(f"backend=tinker: {watch.result()}")
    return main.result()


def scenario_notes(scenario: Scenario | Mixture, system_prompt: str | None) -> list[str]:
    """What run.log says of each scenario: what counts as correct, and how a rollout function
    that takes no context receives the system prompt (GEPA's candidates included)."""
    from art_rlvr.rollouts.prompted import PROMPTING

    notes = [f"correct ({t.name}): {t.correct_rule}" for t in scenario.scenarios]
    return notes + [
        f"rollout function {t.rollout_fn.ref} takes (model, record): {PROMPTING}"
        for t in scenario.scenarios
        if t.rollout_fn is not None and not t.rollout_fn.takes_context
        and (system_prompt or t.default_system_prompt)
    ]  # fmt: skip


async def register(model: Any, backend: Any, cfg: RunConfig) -> None:
    """`model.register`, which loads the base model on TorchBackend: one that cannot load
    there (a hub id that is not on the hub, a folder without weights) is a one-line error."""
    try:
        await model.register(backend)
    except Exception as error:
        if cfg.backend == "tinker":  # the service's refusal (no room for another LoRA, ...)
            where = os.environ.get("TINKER_BASE_URL") or "Thinking Machines' Tinker"
            raise BackendUnavailable(
                f"backend=tinker: the Tinker service at {where} did not start the training "
                f"client: {first_line(error)}"
            ) from error
        if not isinstance(error, OSError):
            raise
        if cfg.backend != "torch":  # ART's own backends: their errors are theirs to word
            raise
        raise ConfigError(f"base_model={cfg.base_model}: {first_line(error)}") from None


def _usd(cost: float | None) -> str | None:
    return None if cost is None else f"${cost:.6f}"


def write_summary(
    files: RunFiles,
    cfg: RunConfig,
    scenario: Scenario | Mixture,
    result: dict[str, Any],
    started: float,
    prior: dict[str, Any],
) -> RunSummary:
    """summary.json: the mode's result, the run's identity and clocks. A re-run of the same run
    adds its time to the earlier sessions' (each session that ended writes a summary)."""
    from art_rlvr.loops.context import peak_rss_mb

    wall = time.monotonic() - started + float(prior.get("wall_seconds", 0.0))
    summary = RunSummary.model_validate(
        {
            **result,
            **mixture_summary(cfg, files.events()),
            "mode": cfg.mode,
            "phases": [p.label for p in cfg.plan],  # a mode as its preset
            "scenario": scenario.name,
            "correct_rule": "; ".join(dict.fromkeys(t.correct_rule for t in scenario.scenarios)),
            "seed": cfg.seed,
            "base_model": cfg.policy.model or cfg.base_model,
            "wall_seconds": round(wall, 2),
            "peak_rss_mb": round(peak_rss_mb(), 1),
        }
    )
    files.write_json("summary.json", summary.model_dump(mode="json"))
    return summary


def mixture_summary(cfg: RunConfig, events: list[Any]) -> dict[str, Any]:
    """A mixture's weights and per-scenario accuracies: the first and the last val evaluation
    (of the run's weights, untagged) and the last test one; {} for one scenario."""
    if len(cfg.mixture) < 2:
        return {}
    evals = [e for e in events if isinstance(e, EvalEvent) and e.by_scenario and not e.tag]
    val = sorted((e for e in evals if e.split == "val"), key=lambda e: e.step)
    test = [e for e in evals if e.split == "test"]
    return {
        "mixture": {e.name: e.weight for e in cfg.mixture},
        "val_by_scenario_before": val[0].by_scenario if val else None,
        "val_by_scenario_after": val[-1].by_scenario if val else None,
        "test_by_scenario_after": test[-1].by_scenario if test else None,
    }


def _threads() -> dict[str, int | str | None]:
    """What sets a run's speed on CPU, logged beside its config (see art_rlvr/__init__.py)."""
    import torch

    variables = ("OMP_NUM_THREADS", "GOMP_SPINCOUNT")
    return {"torch": torch.get_num_threads(), **{k: os.environ.get(k) for k in variables}}


def summary_lines(summary: RunSummary, directory: Path) -> list[str]:
    """The one-screen summary printed at the end (everything is also in summary.json)."""
    s = summary
    before, after, test = s.val_accuracy_before, s.val_accuracy_after, s.test_accuracy_after
    rows: list[tuple[str, Any]] = [
        ("run", directory),
        ("mode", f"{s.mode} on {s.scenario} (seed {s.seed})"),
        ("phases", " -> ".join(s.phases) if s.phases and len(s.phases) > 1 else None),
        ("policy", s.policy),
        (
            "pass@k",
            ", ".join(f"pass@{k} {v:.3f}" for k, v in sorted(s.pass_at_k.items()))
            + f" (n={s.eval_samples})"
            if s.pass_at_k
            else None,
        ),
        (
            "pass^k",
            ", ".join(f"pass^{k} {v:.3f}" for k, v in sorted(s.pass_all_k.items()))
            if s.pass_all_k and s.eval_samples and s.eval_samples > 1
            else None,
        ),
        ("val acc", _val_line(s.mode, before, after)),
        *scenario_rows(s),
        ("test acc", f"{test:.3f}" if test is not None else None),
        ("steps", s.steps),
        ("rollouts", s.rollouts),
        ("tokens", s.training_tokens),
        ("completion", None if s.completion_tokens is None else f"{s.completion_tokens} tokens"),
        ("cost", (_usd(s.cost_usd) or "unknown to litellm") if s.policy else None),
        ("reflection", _calls(s.reflection_calls, s.reflection_errors)),
        ("teacher", _calls(s.teacher_calls, s.teacher_errors)),
        ("s changes", s.prompt_changes),
        ("stopped", (s.early_stop or {}).get("message")),
        ("wall", f"{s.wall_seconds:.1f} s, peak RSS {s.peak_rss_mb:.0f} MB"),
    ]
    lines = [f"{name:<11}{value}" for name, value in rows if value is not None]
    lines += [f"ALARM      step {a['step']}: {a['message']}" for a in s.alarms]
    evaluated_only = all(p.startswith("eval_") for p in s.phases) if s.phases else s.mode == "eval"
    return lines + next_steps(directory, trained=not evaluated_only and not s.policy)


def _val_line(mode: str, before: float | None, after: float | None) -> str:
    """`0.400 -> 0.650` for a run that trained; one number for an evaluation."""
    if before is None or after is None:
        return "n/a"
    return f"{after:.3f}" if mode == "eval" else f"{before:.3f} -> {after:.3f}"


def python_command() -> str:
    """How to start Python here as the user would type it, so a printed command runs as
    printed: `uv run python` under uv, the venv's interpreter by path when the venv is not
    activated, else `python`."""
    if os.environ.get("UV"):  # `uv run` sets it
        return "uv run python"
    in_venv = sys.prefix != sys.base_prefix
    if in_venv and os.environ.get("VIRTUAL_ENV") != sys.prefix:
        executable = Path(sys.executable)
        try:
            return str(executable.relative_to(Path.cwd()))
        except ValueError:
            return str(executable)
    return "python"


def next_steps(directory: Path, *, trained: bool) -> list[str]:
    """What to do with the run, each a command that runs as printed."""
    py, run = python_command(), shlex.quote(str(directory))
    steps = [
        ("report", f"{py} -m art_rlvr.report {run}"),
        ("compare", f"{py} -m art_rlvr.compare {shlex.quote(str(directory.parent))}/*"),
    ]
    if trained:
        steps += [
            (
                "export",
                f"{py} -m art_rlvr.export {run} --out exported/{shlex.quote(directory.name)}",
            ),
            ("serve", f"{py} -m art_rlvr.serve {run}"),
        ]
    return ["", "next:", *[f"  {name:<9}{command}" for name, command in steps]]


def scenario_rows(s: RunSummary) -> list[tuple[str, str]]:
    """A mixture's val accuracy per scenario (before -> after; test too), under the overall
    line, which is their mean."""
    before, after = s.val_by_scenario_before or {}, s.val_by_scenario_after or {}
    test = s.test_by_scenario_after or {}
    rows = [("scenarios", f"{len(after)}; val acc is the mean of theirs:")] if after else []
    for name, last in after.items():
        first = f"{before[name]:.3f} -> " if name in before else ""
        tail = f", test {test[name]:.3f}" if name in test else ""
        rows.append(("", f"{name} {first}{last:.3f}{tail}"))
    return rows


def _calls(calls: int | None, errors: int | None) -> str | None:
    return None if calls is None else f"{calls} call(s), {errors or 0} error(s)"


USER_ERRORS = (
    ConfigError,
    ChatTemplateError,
    PolicyError,
    ScenarioFileError,
    StateFileError,
    BackendUnavailable,
    McpServerError,
)
HELP_WORDS = {"--help", "-h", "help"}
RESUME_LINE = "interrupted; re-run the same command to resume"


def print_help(argv: list[str]) -> int:
    """`--help`: every mode and the main keys; with `mode=<m>`, that mode's keys."""
    modes = [word.partition("=")[2] for word in argv if word.startswith("mode=")]
    mode = modes[-1] if modes else None
    if mode is not None and mode not in MODE_TITLES:
        print(f"error: no mode {mode!r}; one of {', '.join(MODE_TITLES)}", file=sys.stderr)
        return 2
    print(help_text(mode), end="")
    return 0


def scenario_defaults(args: list[str], scenario: Scenario | Mixture) -> list[str]:
    """The scenario file's own settings (`max_tokens`, room for a whole tool call) as
    `key=value` words, for the keys the command line leaves unset."""
    given = {word.partition("=")[0].strip() for word in args}
    wanted = scenario.spec_max_tokens
    return [f"max_tokens={wanted}"] if wanted is not None and "max_tokens" not in given else []


def start_line(cfg: RunConfig, scenario: Scenario | Mixture, files: RunFiles) -> str:
    extra = " + expert iteration" if cfg.enable_expert_iteration and cfg.mode != "ei" else ""
    return (
        f"mode: {MODE_TITLES[cfg.mode]}{extra} | phases={spell(cfg.plan)} | scenario "
        f"{scenario.name} | seed {cfg.seed} | max_tokens {cfg.max_tokens} | run_dir {files.root} "
        "(loading ART, torch and the model)"
    )


def override_line(cfg: RunConfig) -> str | None:
    """The shared knobs a phase runs with its own value (`gepa: group_size=2 (run: 6)`)."""
    overrides = cfg.phase_overrides()
    if not overrides:
        return None
    parts = [
        f"{kind}: " + ", ".join(f"{k}={v} (run: {getattr(cfg, k)})" for k, v in knobs.items())
        for kind, knobs in overrides.items()
    ]
    return "phase overrides: " + "; ".join(parts)


async def interruptible[T](work: Coroutine[Any, Any, T], log_file: Path) -> T:
    """Run `work`; the first Ctrl-C cancels it (its `finally` blocks close the backend), a
    second one quits at once. Once the work has unwound, the process ends with the resume line
    without waiting for a training step still running in a worker thread: the run folder is
    consistent at any moment (state is written atomically; the tests kill runs with SIGKILL at
    random points and resume them)."""
    loop = asyncio.get_running_loop()
    task = asyncio.ensure_future(work)
    presses = 0

    def on_interrupt() -> None:
        nonlocal presses
        presses += 1
        if presses == 1:
            close_progress_bars()  # else each cancelled rollout redraws its bar
            log.warning("stopping (Ctrl-C again to quit at once)")
            task.cancel()
        else:
            quit_interrupted(log_file)

    try:
        loop.add_signal_handler(signal.SIGINT, on_interrupt)
    except (ValueError, RuntimeError, NotImplementedError):  # not the main thread: no handler
        return await task
    try:
        return await task
    except asyncio.CancelledError:
        if presses:
            quit_interrupted(log_file)
        raise
    finally:
        loop.remove_signal_handler(signal.SIGINT)


def quit_interrupted(log_file: Path) -> NoReturn:
    """End the process now, the resume line last on the console and in run.log."""
    close_progress_bars()
    finish(RESUME_LINE, log_file, code=130)
    sys.stderr.flush()
    os._exit(130)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if HELP_WORDS & set(args):
        return print_help(args)
    log_file: Path | None = None  # once run.log exists, what the console shows goes there too
    try:
        cfg = parse_args(args)
        scenario, files = prepare(cfg)
        if defaults := scenario_defaults(args, scenario):  # as if typed: handed down like them
            cfg = parse_args([*args, *defaults])
        setup_logging(cfg, files)
        log_file = files.root / "run.log"
        log.info("%s", start_line(cfg, scenario, files))
        if overrides := override_line(cfg):
            log.info("%s", overrides)
        import_heavy_modules(cfg)
        summary = asyncio.run(interruptible(execute(cfg, scenario, files), log_file))
    except USER_ERRORS as error:
        return finish(f"error: {error}", log_file, code=2)
    except RolloutsFailed as error:
        return finish(f"error: {error}", log_file, code=1)
    except (KeyboardInterrupt, asyncio.CancelledError):
        return finish(RESUME_LINE, log_file, code=130)
    except Exception:
        if log_file is None:
            raise
        log.exception("the run crashed (a bug: please report it with run.log)")
        return finish("", log_file, code=1)
    return finish("\n".join(summary_lines(summary, cfg.directory)), log_file, code=0)


def import_heavy_modules(cfg: RunConfig) -> None:
    """ART, torch and the loops (~15 s of CPU), imported before the event loop starts: here a
    Ctrl-C stops them at once; inside the loop it would be seen only once they were done."""
    names = ["art_rlvr.loops.context"]  # art, and through it torch
    if cfg.policy.model is None and cfg.backend == "torch":
        names.append("art_rlvr.backend.torch_backend")  # transformers, peft
    for name in names:
        importlib.import_module(name)


def close_progress_bars() -> None:
    """Close the bars a cancelled or failed gather left open (ART's gather closes its bar only
    when it completes): tqdm would redraw them at exit, after the run's last line."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        bar.close()


def finish(text: str, log_file: Path | None, *, code: int) -> int:
    """Print the run's last lines (stdout for a summary, stderr otherwise) and append them to
    run.log once it exists, so the file ends as the console did."""
    close_progress_bars()
    if log_file is not None:
        close_logging()
        if text:
            with log_file.open("a", encoding="utf-8") as handle:
                handle.write(text + "\n")
    if text:
        print(text, file=sys.stdout if code == 0 else sys.stderr, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
