"""`python -m art_rlvr.report`: a real tiny RL run reported and opened in headless Chromium, and
synthetic run folders for every mode and every edge (missing or non-run folder, unfinished run,
a metrics line cut by a crash, hostile model output, alarms, prompt changes, EI counters)."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from html import escape, unescape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from art_rlvr.report import plots
from art_rlvr.report.__main__ import main
from art_rlvr.rundir.events import EvalEvent, TrainEvent
from art_rlvr.rundir.stored import StoredTrajectory, read_groups

RL_RUN = [
    "scenario=arith",
    "mode=rl",
    "n_batches=2",
    "groups_per_batch=2",
    "group_size=4",
    "eval_every=1",
    "val_limit=8",
    "eval_test=false",
    "max_tokens=16",
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HOSTILE = '<script>alert("pwned")</script>'
HOSTILE_IMG = "<img src=x onerror=alert(1)>"
SEED = "Answer the question."
BETTER = "Reply with a bare number and nothing else."


# ------------------------------------------------------------------ the real run


@pytest.fixture(scope="module")
def real_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("report") / "rl-tiny"
    proc = subprocess.run(
        [sys.executable, "-m", "art_rlvr.run", *RL_RUN, f"run_dir={run_dir}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def real_page(real_run: Path) -> Path:
    proc = subprocess.run(
        [sys.executable, "-m", "art_rlvr.report", str(real_run)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = real_run / "report" / "index.html"
    assert proc.stdout.strip() == str(page)
    return page


def rows(path: Path) -> list[StoredTrajectory]:
    return [t for g in read_groups(path) for t in g.trajectories]


def test_report_of_a_real_rl_run(real_run: Path, real_page: Path) -> None:
    html = real_page.read_text()
    summary = json.loads((real_run / "summary.json").read_text())
    assert "rl-tiny" in html and "RL-only" in html and "finished" in html
    assert f"{summary['val_accuracy_after']:.3f}" in html
    for name in ("curves", "groups", "tokens"):
        png = (real_page.parent / f"{name}.png").read_bytes()
        assert png.startswith(PNG_MAGIC) and len(png) > 5000
        assert base64.b64encode(png).decode() in html  # the same image, embedded
    best = max(rows(real_run / "trajectories" / "train_0002.jsonl"), key=lambda r: r.reward)
    assert escape(best.completion) in html
    assert_self_contained(html)


def assert_self_contained(html: str) -> None:
    """One file that opens offline: its only scripts are the browser's own two inline blocks
    (the data, the code), and nothing is fetched."""
    assert html.count("<script") == 2, html.count("<script")
    assert '<script type="application/json" id="rollout-data">' in html
    assert "<script src" not in html and 'src="http' not in html and "<link" not in html


class Dom(HTMLParser):
    """What a rendered page holds: ids, images, tags, all text and the trajectory section's."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.images: dict[str, str] = {}
        self.ids: set[str] = set()
        self.tags: list[str] = []
        self.text: list[str] = []
        self.trajectory_text: list[str] = []
        self._depth = 0  # >0 inside <section id="trajectories">
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append(tag)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        if tag == "img":
            self.images[str(a.get("id"))] = str(a.get("src"))
        if tag == "section" and (self._depth or a.get("id") == "trajectories"):
            self._depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "section" and self._depth:
            self._depth -= 1

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._depth:
            self.trajectory_text.append(data)


# appended to a *copy* of the page: lists what the browser decoded for each image
PROBE = """<script>window.addEventListener("load", () => {
  const p = document.createElement("pre"); p.id = "probe";
  p.textContent = [...document.images].map(i => `${i.id} ${i.complete} ${i.naturalWidth}`).join("\\n");
  document.body.appendChild(p);
});</script>"""


def chromium(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.fail("chromium is not installed: `apt-get install chromium` (CI installs it)")
    return subprocess.run(
        [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            f"--user-data-dir={cwd / 'chromium-profile'}",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
    )


def dump_dom(page: Path, cwd: Path, *extra: str) -> str:
    done = chromium(*extra, "--dump-dom", page.as_uri(), cwd=cwd)
    assert done.returncode == 0 and "</html>" in done.stdout, done.stderr[-2000:]
    return done.stdout


@pytest.mark.browser
def test_report_renders_in_headless_chromium(
    real_run: Path, real_page: Path, tmp_path: Path
) -> None:
    dom = Dom(dump_dom(real_page, tmp_path))
    assert {"summary", "config", "curves", "evals", "prompts", "trajectories"} <= dom.ids
    assert {"plot-curves", "plot-groups", "plot-tokens"} <= dom.images.keys()
    for src in dom.images.values():
        head, _, data = src.partition(",")
        assert head == "data:image/png;base64"
        png = base64.b64decode(data, validate=True)
        assert png.startswith(PNG_MAGIC) and len(png) > 5000
    text = "".join(dom.trajectory_text)
    completions = [r.completion for r in rows(real_run / "trajectories" / "train_0001.jsonl")]
    assert any(c and c in text for c in completions), "no real completion in the trajectories"

    # the images really decode in the browser
    probe = tmp_path / "probe.html"
    probe.write_text(real_page.read_text().replace("</body>", PROBE + "</body>"))
    probed = dump_dom(probe, tmp_path, "--virtual-time-budget=5000")
    report = probed.split('<pre id="probe">')[-1].split("</pre>")[0].split()
    loaded = dict(zip(report[::3], zip(report[1::3], report[2::3], strict=True), strict=True))
    assert set(loaded) == set(dom.images), probed[-2000:]
    assert all(ok == "true" and int(width) >= 600 for ok, width in loaded.values()), loaded

    shot = tmp_path / "page.png"
    size = "--window-size=1280,2400"
    done = chromium(f"--screenshot={shot}", size, real_page.as_uri(), cwd=tmp_path)
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    from PIL import Image

    with Image.open(shot) as image:
        assert image.size == (1280, 2400)
        low, high = image.convert("L").getextrema()
        colours = len(image.convert("RGB").getcolors(1 << 24) or [])
        dark = sum(image.convert("L").histogram()[:128]) / (1280 * 2400)
    assert high - low > 150 and colours > 50 and dark > 0.005, (low, high, colours, dark)


# ------------------------------------------------------------------ synthetic run folders


def traj(
    scenario_id: str, completion: str, reward: float, feedback: str = "", system: str = SEED
) -> dict[str, Any]:
    return {
        "scenario_id": scenario_id,
        "prompt_hash": "abc",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": f"What is {scenario_id}?"},
        ],
        "completion": completion,
        "reward": reward,
        "feedback": feedback or ("correct" if reward >= 1 else "wrong answer"),
        "metrics": {"correct": float(reward >= 1), "completion_tokens": len(completion.split())},
    }


def train_event(step: int, reward: float) -> dict[str, Any]:
    return {
        "event": "train",
        "step": step,
        "reward_mean": reward,
        "accuracy": reward,
        "tokens_per_completion": 10.0 + step,
        "frac_all_correct": 0.25,
        "frac_all_wrong": 0.25,
        "frac_mixed": 0.5,
        "trajectories": 8.0,
        "wall_seconds": 10.0 * step,
    }


def eval_event(step: int, accuracy: float, split: str = "val", tag: str = "") -> dict[str, Any]:
    return {
        "event": "eval",
        "split": split,
        "step": step,
        "accuracy": accuracy,
        "reward_mean": accuracy,
        "tokens_per_completion": 9.0,
        "errors": 0,
        "tag": tag,
        "wall_seconds": 5.0 + step,
    }


def ei_round(r: int) -> dict[str, Any]:
    return {
        "event": "ei_round",
        "round": r,
        "step": r + 1,
        "clean_accuracy": 0.3 + 0.1 * r,
        "clean_solved": 3 + r,
        "examples_distilled": 4 + r,
        "hints_generated": 2,
        "hints_leak_rejected": 7,
        "recovered": 1,
        "teacher_errors": 0,
    }


def gepa_history() -> list[dict[str, Any]]:
    return [
        {"iteration": 0, "kind": "reflection", "parents": [0], "prompt": "Think hard.", "score_before": 0.5, "score_after": 0.25, "accepted": False, "reason": "minibatch score 0.250 vs its parent's 0.500: not above it", "metric_calls": 8},
        {"iteration": 1, "kind": "reflection", "parents": [0], "prompt": BETTER, "score_before": 0.25, "score_after": 0.75, "accepted": True, "reason": "", "candidate": 1, "pareto_mean": 0.625, "metric_calls": 20},
    ]  # fmt: skip


def write_gepa(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "prompt_history.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in gepa_history())
    )
    candidates = [
        {"index": 0, "prompt": SEED, "pareto_scores": {"a": 0.5}},
        {"index": 1, "prompt": BETTER, "parents": [0], "pareto_scores": {"a": 0.625}},
    ]
    result = {"candidates": candidates, "seed_prompt": SEED, "best_prompt": BETTER}
    (folder / "result.json").write_text(json.dumps(result | {"stop_reason": "budget"}))


PROMPT_CHANGE = {
    "event": "prompt_change",
    "round": 0,
    "phase": 0,
    "step": 0,
    "old": SEED,
    "new": BETTER,
    "old_pareto_mean": 0.25,
    "new_pareto_mean": 0.75,
    "origin": "reflection",
    "old_val_accuracy": 0.4,
    "new_val_accuracy": 0.6,
}


def mode_files(mode: str) -> tuple[list[dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """Metrics and trajectory files shaped like each mode's loop writes them."""
    val = [traj("1+1", "2", 1.0), traj("2+2", "five", 0.0, "no number found")]
    train = [traj("3+3", "6", 1.0), traj("3+3", "sixty", 0.0), traj("3+3", "6.", 1.0)]
    if mode == "eval":
        return [eval_event(0, 0.5)], {"val_0000": val}
    if mode == "rl":
        metrics = [eval_event(0, 0.4), train_event(1, 0.3), train_event(2, 0.6), eval_event(2, 0.5)]
        return [*metrics, eval_event(2, 0.45, "test")], {
            "val_0000": val,
            "train_0001": train,
            "train_0002": train,
            "val_0002": val,
            "test_0002": val,
        }
    if mode == "gepa":
        events = [{"event": "gepa", **e} for e in gepa_history()]
        return events, {"val_seed_prompt": val, "val_best_prompt": val}
    if mode == "ei":
        metrics = [eval_event(0, 0.4), ei_round(0), ei_round(1), eval_event(2, 0.6)]
        return metrics, {"val_0000": val, "train_0000": train, "train_0001": train}
    metrics = [eval_event(0, 0.4, tag="_start"), PROMPT_CHANGE, eval_event(0, 0.6, tag="_gepa_r0")]
    metrics += [train_event(1, 0.5), eval_event(1, 0.6, tag="_rl_r0")]
    files = {"val_0000_start": val, "val_0000_gepa_r0": val, "train_0001": train}
    if mode == "gepa_rl_ei":
        metrics += [ei_round(0), eval_event(2, 0.7, tag="_ei_r0")]
    return metrics, files


def write_run(root: Path, mode: str = "rl") -> Path:
    """A finished run folder of `mode`, as the loops write it."""
    (root / "trajectories").mkdir(parents=True)
    config = {"mode": mode, "scenario": "arith", "seed": 0, "run_name": root.name, "n_batches": 2}
    (root / "config.json").write_text(json.dumps(config))
    metrics, files = mode_files(mode)
    (root / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in metrics))
    for name, rows_ in files.items():
        path = root / "trajectories" / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows_))
    if mode == "gepa":
        write_gepa(root / "gepa")
    elif mode.startswith("gepa_rl"):
        write_gepa(root / "gepa" / "round_0")
    summary = {"mode": mode, "scenario": "arith", "seed": 0, "val_accuracy_before": 0.4}
    summary |= {"val_accuracy_after": 0.6, "rollouts": 16, "wall_seconds": 125.0}
    if mode == "gepa":
        summary |= {"seed_prompt": SEED, "best_prompt": BETTER}
    (root / "summary.json").write_text(json.dumps(summary))
    return root


def report(run_dir: Path, *extra: str) -> tuple[int, str]:
    code = main([str(run_dir), *extra])
    page = run_dir / "report" / "index.html"
    return code, page.read_text() if code == 0 and page.exists() else ""


@pytest.mark.browser
def test_hostile_text_stays_text_in_chromium(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run")
    hostile(root)
    assert main([str(root)]) == 0
    page = root / "report" / "index.html"
    dom = Dom(dump_dom(page, tmp_path))
    assert dom.tags.count("script") == 2 and dom.tags.count("img") == len(dom.images) == 3
    text = "".join(dom.text)
    assert HOSTILE in text and HOSTILE_IMG in text and "</pre></details>" + HOSTILE in text
    # the browser renders the same rows as text, never as markup (no alert, no extra tags)
    (shown,) = browse(page, tmp_path, [{"f-scenario": "<script"}])
    assert shown["count"].startswith("2 of ") and HOSTILE in shown["first"], shown


# appended to a copy of the page: for each filter setting (every filter reset first), what the
# browser lists, its count line, and the text of the first rollout once opened
BROWSE = """<script>window.addEventListener("load", () => {
  const steps = __STEPS__, out = [];
  const ids = ["f-kind", "f-step", "f-outcome", "f-scenario", "f-calls", "f-errors"];
  const set = (id, value) => {
    const e = document.getElementById(id);
    if (e.type === "checkbox") e.checked = value; else e.value = value;
    e.dispatchEvent(new Event("change"));
  };
  const run = (i) => {
    if (i === steps.length) {
      const p = document.createElement("pre"); p.id = "probe";
      p.textContent = JSON.stringify(out); document.body.appendChild(p); return;
    }
    for (const id of ids) set(id, id === "f-calls" || id === "f-errors" ? false : "");
    for (const [id, value] of Object.entries(steps[i])) set(id, value);
    const items = [...document.querySelectorAll("#browse-list details.rollout")];
    if (items.length) items[0].open = true;
    setTimeout(() => {
      out.push({
        count: document.getElementById("browse-count").textContent,
        heads: items.map((d) => d.querySelector("summary").textContent),
        first: items.length ? items[0].textContent : "",
        more: !document.getElementById("browse-more").hidden,
        alerts: window.__alerts || 0,
      });
      run(i + 1);
    }, 20);
  };
  run(0);
});
window.alert = () => { window.__alerts = (window.__alerts || 0) + 1; };</script>"""


def browse(page: Path, tmp: Path, steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Drive the page's trajectory browser in headless Chromium, as a user would (set each
    filter, open the first rollout listed), and return what it showed for each setting."""
    probe = tmp / "browse.html"
    script = BROWSE.replace("__STEPS__", json.dumps(steps))
    probe.write_text(page.read_text().replace("</body>", script + "</body>"))
    dumped = dump_dom(probe, tmp, "--virtual-time-budget=10000")
    text = dumped.split('<pre id="probe">')[-1].split("</pre>")[0]
    return json.loads(unescape(text))


@pytest.mark.browser
def test_the_browser_filters_every_rollout_in_chromium(
    real_run: Path, real_page: Path, tmp_path: Path
) -> None:
    """Every stored rollout is in the browser, and each filter (split, step, outcome, scenario)
    lists exactly the rollouts the trajectory files hold for it; an opened one shows its prompt,
    its completion and its feedback."""
    files = sorted((real_run / "trajectories").glob("*.jsonl"))
    stored = [(f.stem, r) for f in files for r in rows(f)]
    val2 = rows(real_run / "trajectories" / "val_0002.jsonl")
    wrong = [r for _, r in stored if not r.correct]
    scenario = val2[0].scenario_id
    same = [r for r in val2 if scenario.lower() in r.scenario_id.lower()]
    shown = browse(real_page, tmp_path, [
        {}, {"f-kind": "val"}, {"f-kind": "val", "f-step": "2"}, {"f-outcome": "wrong"},
        {"f-kind": "val", "f-step": "2", "f-scenario": scenario}, {"f-calls": True},
    ])  # fmt: skip
    everything, val, val_at_2, failed, one, calls = shown
    assert everything["count"] == f"{len(stored)} of {len(stored)} rollouts"
    assert len(everything["heads"]) == min(len(stored), 50)
    assert val["count"].startswith(f"{sum(s.startswith('val') for s, _ in stored)} of ")
    assert val_at_2["count"].startswith(f"{len(val2)} of ")
    assert all(h.startswith("val \u00b7 step 2 \u00b7") for h in val_at_2["heads"])
    assert failed["count"].startswith(f"{len(wrong)} of ")
    assert all("\u00b7 wrong" in h for h in failed["heads"])
    assert one["count"].startswith(f"{len(same)} of ") and scenario in one["heads"][0]
    row = val2[0]
    assert row.completion in one["first"] and row.feedback in one["first"]
    assert "prompt (2 messages)" in one["first"] and "assistant, turn 0" in one["first"]
    assert calls["count"].startswith("0 of ")  # arithmetic calls no tool
    assert not any(s["alerts"] for s in shown)


# fmt: off
MODES = [
    ("eval", ['id="plot-curves"', "evaluation only", "five", "1/2 correct"]),
    ("rl", ['id="plot-groups"', 'id="plot-tokens"', "best of step 2", "sixty", "The system prompt stayed fixed"]),
    ("gepa", ['id="plot-gepa"', "<ins>Reply with", "1 accepted", "seed &rarr; best prompt", "val seed_prompt"]),
    ("ei", ['id="plot-ei"', "hints_leak_rejected", "round 1 (step 2)", "best of round 1"]),
    ("gepa_rl", ["Pareto mean 0.250 &rarr; 0.750", "val accuracy 0.400 &rarr; 0.600", "gepa/round_0", "gepa_r0"]),
    ("gepa_rl_ei", ['id="plot-ei"', "Pareto mean 0.250 &rarr; 0.750", "ei_r0"]),
]
# fmt: on


@pytest.mark.parametrize(("mode", "expected"), MODES)
def test_every_mode_renders(tmp_path: Path, mode: str, expected: list[str]) -> None:
    code, html = report(write_run(tmp_path / f"run-{mode}", mode))
    assert code == 0
    for text in expected:
        assert text in html, text
    for png in (tmp_path / f"run-{mode}" / "report").glob("*.png"):
        assert png.read_bytes().startswith(PNG_MAGIC)
    assert 'id="alarms"' not in html and "unfinished" not in html


def hostile(root: Path) -> None:
    """Model output, feedback, prompts, a run name and an alarm that try to become markup."""
    rows_ = [
        traj(HOSTILE, HOSTILE, 1.0, HOSTILE_IMG, system=HOSTILE),
        traj("x", "</pre></details>" + HOSTILE, 0.0, HOSTILE_IMG),
    ]
    for name in ("train_0001", "val_0002"):
        path = root / "trajectories" / f"{name}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows_))
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps(config | {"run_name": HOSTILE_IMG}))
    change = PROMPT_CHANGE | {"old": HOSTILE_IMG, "new": HOSTILE}
    append(change, {"event": "alarm", "kind": HOSTILE, "step": 2, "message": HOSTILE})(root)


def append(*records: dict[str, Any] | str) -> Callable[[Path], None]:
    """An edit that appends records (or a raw, possibly cut, line) to metrics.jsonl."""

    def edit(root: Path) -> None:
        with (root / "metrics.jsonl").open("a") as handle:
            for r in records:
                handle.write(r if isinstance(r, str) else json.dumps(r) + "\n")

    return edit


def drop_summary(root: Path) -> None:
    (root / "summary.json").unlink()


def just_started(root: Path) -> None:
    """Killed before its first evaluation: only config.json (and an empty folder) exist."""
    for name in ("summary.json", "metrics.jsonl"):
        (root / name).unlink()
    shutil.rmtree(root / "trajectories")


def state_with_change(root: Path) -> None:
    (root / "state.json").write_text(json.dumps({"prompt_changes": [PROMPT_CHANGE]}))


ALARM = {"event": "alarm", "kind": "reward_hacking", "step": 2, "message": "possible reward hacking: train reward rose 0.3 -> 0.6"}  # fmt: skip
EARLY = {"event": "early_stop", "kind": "early_stop", "step": 2, "message": "val accuracy has not improved on 0.500 for 2 evaluations"}  # fmt: skip


# fmt: off
EDGES = [
    ("unfinished run", drop_summary, ["unfinished run: no summary.json yet", "No summary.json yet", 'id="plot-curves"'], []),
    ("just started", just_started, ["unfinished run", "Nothing to plot yet", "No trajectories recorded yet"], ["<img"]),
    ("cut last metrics line", append('{"event": "train", "step": 3, "rew'), ["1 line(s) of metrics.jsonl could not be read", "best of step 2"], []),
    ("hostile text", hostile, [escape(HOSTILE), escape(HOSTILE_IMG), "&lt;/pre&gt;&lt;/details&gt;"], [HOSTILE, "<img src=x", "</pre></details><script"]),
    ("alarm and early stop", append(ALARM, EARLY), ['id="alarms"', "reward_hacking</b> at step 2", escape(ALARM["message"]), escape(EARLY["message"])], []),
    ("prompt change", append(PROMPT_CHANGE), ["<del>Answer the question.</del><ins>Reply with a bare number and nothing else.</ins>", "Pareto mean 0.250 &rarr; 0.750"], []),
    ("ei counters", append(ei_round(0), ei_round(1)), ["Expert iteration per round", "<td>hints_leak_rejected</td><td>7</td><td>7</td>"], []),
    ("state.json prompt changes", state_with_change, ["1 accepted change(s)", "<ins>Reply with a bare"], []),
]
# fmt: on


@pytest.mark.parametrize(("case", "edit", "expected", "absent"), EDGES)
def test_edge_cases(
    tmp_path: Path, case: str, edit: Callable[[Path], None], expected: list[str], absent: list[str]
) -> None:
    root = write_run(tmp_path / "run")
    edit(root)
    code, html = report(root)
    assert code == 0, case
    for text in expected:
        assert text in html, text
    for text in absent:
        assert text not in html, text
    if 'id="alarms"' in expected:
        assert html.index('id="alarms"') < html.index('id="summary"')  # at the top


def missing(tmp: Path) -> Path:
    return tmp / "nope"


def a_file(tmp: Path) -> Path:
    (tmp / "f.txt").write_text("x")
    return tmp / "f.txt"


def not_a_run(tmp: Path) -> Path:
    (tmp / "notes").mkdir()
    (tmp / "notes" / "todo.md").write_text("x")
    return tmp / "notes"


def corrupt_summary(tmp: Path) -> Path:
    root = write_run(tmp / "run")
    (root / "summary.json").write_text('{"mode": "r')
    return root


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (missing, "no such folder"),
        (a_file, "is a file, not a run folder"),
        (not_a_run, "is not a run folder"),
        (corrupt_summary, "summary.json is corrupt"),
    ],
)
def test_bad_folders_are_one_line_errors(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    make: Callable[[Path], Path],
    message: str,
) -> None:
    target = make(tmp_path)
    assert main([str(target)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
    assert not (target / "report").exists()


def test_out_folder_and_self_contained_page(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run", "gepa_rl_ei")
    out = tmp_path / "mailed"
    assert main([str(root), "--out", str(out)]) == 0
    html = (out / "index.html").read_text()
    assert not (root / "report").exists()
    pngs = sorted(p.stem for p in out.glob("*.png"))
    assert pngs == ["curves", "ei", "gepa", "groups", "tokens"]
    srcs = [part.split('"')[0] for part in html.split('src="')[1:]]
    assert len(srcs) == len(pngs) and all(s.startswith("data:image/png;base64,") for s in srcs)
    assert all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', html))  # in-page only
    assert_self_contained(html)


def train_record(step: int, reward: float, accuracy: float) -> TrainEvent:
    return TrainEvent.model_validate({**train_event(step, reward), "accuracy": accuracy})


def val_record(step: int, accuracy: float) -> EvalEvent:
    return EvalEvent.model_validate(eval_event(step, accuracy))


def drawn(fig: Any) -> tuple[Any, list[float]]:
    """The axes of a figure once drawn, and its x ticks inside the visible range."""
    fig.canvas.draw()
    (ax,) = fig.axes
    low, high = ax.get_xlim()
    return ax, [float(t) for t in ax.get_xticks() if low <= t <= high]


def test_step_axes_have_whole_numbers_and_series_stay_apart() -> None:
    """Steps are integers on every step axis (no 0.5 ticks); train reward and train accuracy
    are two distinguishable lines, or one line saying so when a 0/1 reward makes them equal."""
    train = [train_record(1, 0.3, 0.2), train_record(2, 0.5, 0.4), train_record(3, 0.6, 0.6)]
    evals = [val_record(0, 0.2), val_record(3, 0.5)]
    figures = [
        plots.curves_figure(train, evals, [], "step"),
        plots.group_fractions_figure(train),
        plots.tokens_figure(train, evals, "step"),
    ]
    for fig in figures:
        _, ticks = drawn(fig)
        assert len(ticks) >= 2 and all(t.is_integer() for t in ticks), ticks
    ax, _ = drawn(figures[0])
    lines = {line.get_label(): line for line in ax.get_lines()}
    reward, accuracy = lines["train reward"], lines["train accuracy"]
    assert (reward.get_color(), reward.get_linestyle()) != (
        accuracy.get_color(),
        accuracy.get_linestyle(),
    )
    same = [train_record(s, r, r) for s, r in ((1, 0.25), (2, 0.5))]
    ax, _ = drawn(plots.curves_figure(same, [], [], "step"))
    assert [line.get_label() for line in ax.get_lines()] == ["train reward (= accuracy)"]


@pytest.mark.parametrize(
    ("rewards", "low", "high"),
    [((0.3, 0.6), -0.03, 1.03), ((-100.0, 5.0), -103.15, 8.15), ((0.5, 2.0), -0.06, 2.06)],
)
def test_the_reward_axis_widens_to_rewards_outside_zero_to_one(
    rewards: tuple[float, float], low: float, high: float
) -> None:
    """A rollout function's ART rewards (-100 for an illegal move, 2 for a win) stay on the
    plot; a [0, 1] reward keeps the unit axis."""
    train = [train_record(1, rewards[0], 0.0), train_record(2, rewards[1], 1.0)]
    ax, _ = drawn(plots.curves_figure(train, [], [], "step"))
    assert ax.get_ylim() == pytest.approx((low, high))


def test_the_summary_says_what_counted_as_correct(tmp_path: Path) -> None:
    root = write_run(tmp_path / "run")
    summary = json.loads((root / "summary.json").read_text())
    rule = "the `correct` metric if set, else reward >= 5 (the scenario's correct_threshold)"
    (root / "summary.json").write_text(json.dumps({**summary, "correct_rule": rule}))
    code, html = report(root)
    assert code == 0 and "Correct: the `correct` metric if set, else reward &gt;= 5" in html


def test_an_evaluation_alone_is_centred_on_its_step() -> None:
    """An eval-only run has one point: the axis spans step +- 1 with one tick, the step
    (it used to run from -0.045 to 0.045)."""
    for fig in (
        plots.curves_figure([], [val_record(0, 0.5)], [], "step"),
        plots.tokens_figure([], [val_record(0, 0.5)], "step"),
    ):
        ax, ticks = drawn(fig)
        assert ax.get_xlim() == (-1.0, 1.0) and ticks == [0.0]
