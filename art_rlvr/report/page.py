"""The report page: one self-contained HTML document (inline CSS, PNGs as data URIs, the
trajectory browser's data and script inline; nothing is fetched), so the single file still
works offline, mailed or attached to an issue."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping

from art_rlvr.config.run_config import MODE_TITLES
from art_rlvr.report.browser import browser_section
from art_rlvr.report.markup import details, duration, esc, num, pre, section, table
from art_rlvr.report.prompts import prompt_section
from art_rlvr.report.samples import system_prompt, trajectory_section
from art_rlvr.report.style import CSS
from art_rlvr.rundir.events import EIRoundEvent, EvalEvent, TrainEvent
from art_rlvr.rundir.reader import RunFolder

COMMON_KEYS = ("scenario", "seed", "base_model", "backend", "system_prompt", "max_tokens")
RL_KEYS = ("groups_per_batch", "group_size", "learning_rate", "loss_fn", "lora_rank", "temperature")
MODE_KEYS: dict[str, tuple[str, ...]] = {
    "eval": ("val_limit", "eval_temperature"),
    "rl": ("n_batches", *RL_KEYS, "eval_every", "val_limit", "patience"),
    "gepa": ("gepa.max_metric_calls", "gepa.reflection.model", "gepa.traces_per_iteration",
             "gepa.group_size", "gepa.pareto_size", "val_limit"),
    "ei": ("ei.rounds", "ei.scenarios_per_round", "ei.group_size", "ei.distill",
           "ei.enable_teacher_hints", "ei.teacher.model", "val_limit"),
}  # fmt: skip
MODE_KEYS["gepa_rl"] = (
    "rounds",
    "rl_batches_per_round",
    "skip_first_gepa",
    "enable_expert_iteration",
    *RL_KEYS,
    "gepa.max_metric_calls",
    "gepa.reflection.model",
    "val_limit",
)
MODE_KEYS["gepa_rl_ei"] = (*MODE_KEYS["gepa_rl"], "ei.scenarios_per_round", "ei.distill")
SUMMARY_KEYS = (
    ("val accuracy before", "val_accuracy_before"),
    ("val accuracy after", "val_accuracy_after"),
    ("test accuracy after", "test_accuracy_after"),
    ("steps", "steps"),
    ("rounds", "rounds"),
    ("rollouts", "rollouts"),
    ("training tokens", "training_tokens"),
    ("prompt changes", "prompt_changes"),
    ("metric calls (GEPA)", "metric_calls_used"),
    ("reflection calls", "reflection_calls"),
    ("reflection errors", "reflection_errors"),
    ("teacher calls", "teacher_calls"),
    ("examples distilled", "examples_distilled"),
    ("examples distilled (EI)", "examples_distilled"),
    ("recovered by hints", "recovered"),
    ("peak RSS MB", "peak_rss_mb"),
)
EI_SKIP = {"event", "round", "step", "wall_seconds", "cpu_seconds", "seconds", "seconds_sampling",
           "seconds_teacher"}  # fmt: skip

CAPTIONS = {
    "curves": "Train reward and accuracy per step; val (and test) accuracy at each evaluation.",
    "groups": "Fraction of groups all correct / mixed / all wrong per step (only mixed groups "
    "carry a GRPO learning signal).",
    "tokens": "Tokens per completion: sampled in training, greedy in evaluation.",
    "episodes": "Multi-turn episodes: turns, tool calls, tool errors and illegal actions per "
    "episode, in training batches and in each evaluation.",
    "scenarios": "Val accuracy of each scenario of the mixture at each evaluation.",
    "ei": "Expert-iteration counters per round.",
    "gepa": "GEPA proposals: the parent's minibatch mean against the proposal's.",
}


def config_value(config: Mapping[str, object], dotted: str) -> tuple[bool, object]:
    """(found, value) of a dotted key such as `gepa.max_metric_calls`."""
    value: object = config
    for part in dotted.split("."):
        if not isinstance(value, dict) or part not in value:
            return False, None
        value = value[part]
    return True, value


def header(run: RunFolder) -> str:
    cfg, summary = run.config, run.summary
    title = MODE_TITLES.get(run.mode, run.mode)
    status = "unfinished (no summary.json)" if summary is None else "finished"
    if summary is not None and summary.failed:
        status = f"failed: {summary.failed}"
    scenario = summary.scenario if summary is not None else cfg.get("scenario", "?")
    seed = summary.seed if summary is not None else cfg.get("seed", "?")
    return (
        f"<header><h1>{esc(run.name)}</h1><p class='sub'>{esc(title)} &middot; scenario "
        f"<b>{esc(scenario)}</b> &middot; seed "
        f"<b>{esc(seed)}</b> &middot; {esc(status)} "
        f"&middot; <code>{esc(run.root)}</code></p></header>"
    )


def alarm_box(run: RunFolder) -> str:
    alarms = run.alarms
    if not alarms:
        return ""
    items = "".join(
        f"<li><b>{esc(a.kind)}</b>"
        + (f" at {esc(run.step_unit)} {esc(a.step)}" if a.step is not None else "")
        + f": {esc(a.message)}</li>"
        for a in alarms
    )
    return (
        '<section id="alarms" class="alarm" role="alert"><h2>&#9888; Alarms</h2>'
        f"<ul>{items}</ul><p>Read the latest trajectories below before trusting the reward."
        "</p></section>"
    )


def notes_box(run: RunFolder) -> str:
    if not run.notes:
        return ""
    items = "".join(f"<li>{esc(n)}</li>" for n in run.notes)
    return f'<section id="notes" class="note"><ul>{items}</ul></section>'


def progress(run: RunFolder) -> dict[str, object]:
    """Numbers of an unfinished run, from metrics.jsonl (a finished one has summary.json)."""
    train = run.events(TrainEvent)
    val = [e for e in run.events(EvalEvent) if e.split == "val"]
    walls = [w for r in run.metrics if isinstance(w := getattr(r, "wall_seconds", None), float)]
    return {
        "steps": train[-1].step if train else None,
        "val_accuracy_before": val[0].accuracy if val else None,
        "val_accuracy_after": val[-1].accuracy if len(val) > 1 else None,
        "rollouts": int(sum(r.trajectories for r in train)) or None,
        "wall_seconds": max(walls) if walls else None,
    }


def summary_section(run: RunFolder) -> str:
    numbers: Mapping[str, object] = (
        run.summary.model_dump() if run.summary is not None else progress(run)
    )
    cards = [
        f'<div class="card"><span>{esc(label)}</span><b>{esc(num(numbers[key]))}</b></div>'
        for label, key in SUMMARY_KEYS
        if numbers.get(key) is not None and not isinstance(numbers[key], dict | list)
    ]
    cards.append(
        f'<div class="card"><span>wall time</span><b>{esc(duration(numbers.get("wall_seconds")))}'
        "</b></div>"
    )
    rule = numbers.get("correct_rule")
    said = f"<p class='small'>Correct: {esc(rule)}.</p>" if rule else ""
    full = said + (
        details("summary.json", pre(run.summary.model_dump_json(indent=2)))
        if run.summary is not None
        else "<p class='small'>No summary.json yet: numbers so far, from metrics.jsonl.</p>"
    )
    return section("summary", "Summary", f'<div class="cards">{"".join(cards)}</div>{full}')


def config_section(run: RunFolder) -> str:
    keys = (*COMMON_KEYS, *MODE_KEYS.get(run.mode, ()))
    found = [(k, *config_value(run.config, k)) for k in keys]
    rows = [(k, "-" if v is None else str(v)) for k, present, v in found if present]
    body = table(["key", "value"], rows, "kv") + details(
        "config.json", pre(json.dumps(run.config, indent=2, sort_keys=True))
    )
    return section("config", "Key config", body)


def figure(name: str, png: bytes) -> str:
    data = base64.b64encode(png).decode("ascii")
    caption = CAPTIONS.get(name, name)
    return (
        f'<figure><img id="plot-{esc(name)}" alt="{esc(caption)}" '
        f'src="data:image/png;base64,{data}"><figcaption>{esc(caption)}</figcaption></figure>'
    )


def figures_section(images: dict[str, bytes]) -> str:
    body = "".join(figure(name, png) for name, png in images.items())
    return section("curves", "Curves", body or "<p>Nothing to plot yet.</p>")


def evals_section(run: RunFolder) -> str:
    evals = run.events(EvalEvent)
    if not evals:
        return ""
    rows = [
        (
            e.split,
            e.index,
            e.tag.lstrip("_") or "-",
            num(e.accuracy),
            num(e.reward_mean),
            num(e.tokens_per_completion, 1),
            e.errors,
        )
        for e in evals
    ]
    header_row = ["split", run.step_unit, "after phase", "accuracy", "reward", "tokens", "errors"]
    return section("evals", "Evaluations", table(header_row, rows))


def ei_section(run: RunFolder) -> str:
    rounds = run.events(EIRoundEvent)
    if not rounds:
        return ""
    lines = [r.line() for r in rounds]
    keys = sorted(
        {k for r in lines for k, v in r.items() if k not in EI_SKIP and not isinstance(v, dict)}
    )
    rows = [(k, *(num(r.get(k)) for r in lines)) for k in keys]
    labels = [f"round {r.round} (step {r.step})" for r in rounds]
    return section("ei", "Expert iteration per round", table(["counter", *labels], rows, "ei"))


def contents(sections: list[str]) -> str:
    """A line of links to the page's sections (the browser sits at the bottom of a long page)."""
    found = [re.match(r'<section id="([^"]+)"[^>]*><h2>([^<]+)</h2>', s) for s in sections]
    links = [f'<a href="#{m[1]}">{m[2]}</a>' for m in found if m]
    return f'<nav class="small">{" &middot; ".join(links)}</nav>' if links else ""


def document(run: RunFolder, images: dict[str, bytes]) -> str:
    """The whole page."""
    sections = [
        summary_section(run),
        config_section(run),
        figures_section(images),
        evals_section(run),
        prompt_section(run, system_prompt(run)),
        ei_section(run),
        trajectory_section(run),
        browser_section(run),
    ]
    body = header(run) + contents(sections) + alarm_box(run) + notes_box(run) + "".join(sections)
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>run report: {esc(run.name)}</title><style>{CSS}</style></head>"
        f"<body>{body}</body></html>\n"
    )
