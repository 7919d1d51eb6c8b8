"""Small HTML helpers. Everything that comes from a run (model output, feedback, prompts,
scenario ids, config values) is hostile text: it goes through `esc` and nowhere else, so a
completion containing `<script>` is shown, never run."""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Sequence

MAX_TEXT = 4000


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """Long texts are cut so one runaway completion cannot make the page unreadable."""
    return text if len(text) <= limit else f"{text[:limit]}\n... ({len(text) - limit} more chars)"


def pre(text: str, cls: str = "") -> str:
    return f'<pre class="{esc(cls)}">{esc(clip(text))}</pre>'


def slug(text: str) -> str:
    """A safe id fragment from any text."""
    return re.sub(r"[^a-z0-9_-]+", "-", str(text).lower()).strip("-") or "x"


def num(value: object, digits: int = 3) -> str:
    """Scores with `digits` decimals, large floats (seconds, MB) with one; '-' for None."""
    if value is None:
        return "-"
    if isinstance(value, float) and not isinstance(value, bool):
        return f"{value:.{digits if abs(value) < 100 else 1}f}"
    return str(value)


def duration(seconds: object) -> str:
    if not isinstance(seconds, int | float):
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s"


def table(header: Sequence[str], rows: Iterable[Sequence[object]], cls: str = "") -> str:
    """A table of already-formatted cells (cells are escaped here)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f'<div class="scroll"><table class="{esc(cls)}"><tr>{head}</tr>{body}</table></div>'


def details(summary_html: str, body_html: str, *, open_: bool = False, cls: str = "") -> str:
    flag = " open" if open_ else ""
    return (
        f'<details class="{esc(cls)}"{flag}><summary>{summary_html}</summary>{body_html}</details>'
    )


def section(id_: str, title: str, body: str, cls: str = "") -> str:
    return f'<section id="{esc(id_)}" class="{esc(cls)}"><h2>{esc(title)}</h2>{body}</section>'
