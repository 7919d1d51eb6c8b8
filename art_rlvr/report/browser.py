"""The trajectory browser: every stored rollout of the run, filtered by split, step, outcome,
scenario item, tool calls and tool errors, each opening into its whole episode (prompt, every
turn, tool calls with their arguments, tool results, the environment's messages, feedback,
logs, metrics).

The rollouts travel inside the page as JSON in a `<script type="application/json">` block,
with `<`, `>` and `&` written as `\\u003c`-style escapes, so no text from a run can close the
block; the page's own script renders them with `textContent` only, never as markup. The page
stays one file that opens offline; without script the static samples above it still show.
"""

from __future__ import annotations

import json

from art_rlvr.report.markup import clip, esc, num, section
from art_rlvr.report.samples import episode_counts, episode_lines
from art_rlvr.rundir.reader import Rollout, RunFolder
from art_rlvr.rundir.stored import Message

PAGE_SIZE = 50  # rollouts listed at a time ("show more" adds as many)


def _message(label: str, cls: str, m: Message) -> list[object]:
    calls = [[c.name, clip(c.arguments)] for c in m.tool_calls]
    return [label, cls, clip(m.content), calls]


def step_key(r: Rollout) -> str:
    """The browser's step of a rollout: its file's step (or EI round), else the file's tag."""
    f = r.file
    return str(f.index) if f.index is not None else f.tag or f.label


def row(r: Rollout, unit: str) -> dict[str, object]:
    """One rollout as the browser's script reads it."""
    t, f = r.trajectory, r.file
    counts = episode_counts(t)
    where = f"{unit} {f.index}" if f.index is not None else (f.tag or f.label)
    head = [f.kind, where, f"#{r.position}", f"scenario {t.scenario_id}", f"reward {num(t.reward)}"]
    head.append("correct" if t.correct else "wrong")
    if counts:
        head.append(counts)
    return {
        "kind": f.kind,
        "step": step_key(r),
        "id": t.scenario_id,
        "ok": t.correct,
        "calls": sum(len(m.tool_calls) for m in t.episode),
        "errors": float(t.metrics.get("tool_errors") or 0) > 0,
        "head": " \u00b7 ".join(head),
        "opening": [_message(m.role, "", m) for m in t.opening],
        "turns": [_message(label, cls, m) for label, cls, m in episode_lines(t)],
        "feedback": clip(t.feedback),
        "logs": [clip(line) for line in t.logs],
        "metrics": ", ".join(f"{k}={num(v)}" for k, v in sorted(t.metrics.items())),
    }


def script_json(data: object) -> str:
    """JSON that is safe inside a <script> element: no `<`, `>` or `&` survives as itself."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


def _options(element_id: str, label: str, values: list[str]) -> str:
    options = "".join(f'<option value="{esc(v)}">{esc(v)}</option>' for v in values)
    return (
        f'<label>{esc(label)} <select id="{element_id}"><option value="">all</option>'
        f"{options}</select></label>"
    )


def browser_section(run: RunFolder) -> str:
    """The section: its controls, the rollouts as JSON and the script that lists them."""
    stored = run.rollouts
    if not stored:
        return ""
    kinds = list(dict.fromkeys(r.file.kind for r in stored))
    steps = list(dict.fromkeys(step_key(r) for r in stored))
    steps.sort(key=lambda s: (not s.isdigit(), int(s) if s.isdigit() else 0, s))
    controls = (
        '<div class="filters">'
        + _options("f-kind", "split", kinds)
        + _options("f-step", run.step_unit, steps)
        + '<label>outcome <select id="f-outcome"><option value="">all</option>'
        '<option value="correct">correct</option><option value="wrong">wrong</option>'
        "</select></label>"
        '<label>scenario <input id="f-scenario" type="search" placeholder="id contains">'
        "</label>"
        '<label><input id="f-calls" type="checkbox"> with tool calls</label>'
        '<label><input id="f-errors" type="checkbox"> with tool errors</label>'
        "</div>"
    )
    rows = [row(r, run.step_unit) for r in stored]
    body = (
        f'<p class="small">All {len(rows)} stored rollouts; pick filters, then open one to read '
        "its whole episode.</p>"
        + controls
        + '<p id="browse-count" class="small"></p><div id="browse-list"></div>'
        + f'<button id="browse-more" type="button">show {PAGE_SIZE} more</button>'
        + f'<script type="application/json" id="rollout-data">{script_json(rows)}</script>'
        + f"<script>{SCRIPT}</script>"
    )
    return section("browse", "Browse every rollout", body)


# The browser's script: reads the JSON above, filters, lists PAGE_SIZE at a time, renders an
# opened rollout with createElement/textContent (never innerHTML: every string is the run's).
SCRIPT = """
(() => {
  const rows = JSON.parse(document.getElementById("rollout-data").textContent);
  const $ = (id) => document.getElementById(id);
  const list = $("browse-list"), count = $("browse-count"), more = $("browse-more");
  const PAGE = __PAGE__;
  let shown = PAGE, matches = [];
  const el = (tag, cls, text) => {
    const node = document.createElement(tag);
    if (cls) node.className = cls;
    if (text !== undefined) node.textContent = text;
    return node;
  };
  const message = ([label, cls, text, calls]) => {
    const box = el("div", cls === "tool" ? "msg result" : "msg");
    box.appendChild(el("span", "role", label));
    if (text || !calls.length) box.appendChild(el("pre", cls, text));
    for (const [name, args] of calls)
      box.appendChild(el("pre", "call", "\\u2192 " + name + "(" + args + ")"));
    return box;
  };
  const body = (r) => {
    const out = el("div", "traj");
    const prompt = el("details");
    prompt.appendChild(el("summary", "", "prompt (" + r.opening.length + " messages)"));
    r.opening.forEach((m) => prompt.appendChild(message(m)));
    out.appendChild(prompt);
    out.appendChild(el("p", "label", "episode"));
    const episode = el("div", "episode");
    r.turns.forEach((m) => episode.appendChild(message(m)));
    out.appendChild(episode);
    out.appendChild(el("p", "label", "feedback"));
    out.appendChild(el("pre", "feedback", r.feedback || "(none)"));
    if (r.logs.length) {
      out.appendChild(el("p", "label", "logs"));
      out.appendChild(el("pre", "", r.logs.join("\\n")));
    }
    out.appendChild(el("p", "small", "metrics: " + (r.metrics || "-")));
    return out;
  };
  const item = (r) => {
    const box = el("details", "rollout");
    box.appendChild(el("summary", r.ok ? "ok" : "bad", r.head));
    box.addEventListener("toggle", () => {
      if (box.open && box.childElementCount === 1) box.appendChild(body(r));
    });
    return box;
  };
  const wanted = () => {
    const kind = $("f-kind").value, step = $("f-step").value, outcome = $("f-outcome").value;
    const scenario = $("f-scenario").value.trim().toLowerCase();
    const calls = $("f-calls").checked, errors = $("f-errors").checked;
    return rows.filter((r) =>
      (!kind || r.kind === kind) && (!step || r.step === step) &&
      (!outcome || r.ok === (outcome === "correct")) &&
      (!scenario || r.id.toLowerCase().includes(scenario)) &&
      (!calls || r.calls > 0) && (!errors || r.errors));
  };
  const draw = () => {
    list.replaceChildren(...matches.slice(0, shown).map(item));
    count.textContent = matches.length + " of " + rows.length + " rollouts" +
      (matches.length > shown ? ", the first " + shown + " listed" : "");
    more.hidden = matches.length <= shown;
  };
  const refilter = () => { matches = wanted(); shown = PAGE; draw(); };
  for (const id of ["f-kind", "f-step", "f-outcome", "f-scenario", "f-calls", "f-errors"]) {
    $(id).addEventListener("input", refilter);
    $(id).addEventListener("change", refilter);
  }
  more.addEventListener("click", () => { shown += PAGE; draw(); });
  refilter();
})();
""".replace("__PAGE__", str(PAGE_SIZE))
