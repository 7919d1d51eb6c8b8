"""The docs say only what holds: their commands parse (with current key names) and pass the
CLI's own checks, the paths, tests and links they name exist, their Python examples import real
names, the CLI reference is the generated one (every key, default and meaning from the config
models) and its error examples are what the CLI prints, the layer diagram and table in
docs/architecture.md are the order `tests/test_layers.py` enforces with every module in it,
every notebook is listed, no user doc cites an issue number or a claim once found stale, and
the README reads in five minutes and shows CI's own test command.

No model is loaded and no run starts: `art_rlvr.run` commands go through the CLI's own config
validation (`parse_args`) and scenario loading (`load_any`, which also checks `source.*` keys);
other entry points are checked for a runnable module.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import re
import shlex
from functools import cache
from pathlib import Path

import pytest

from art_rlvr.config.run_config import parse_args
from art_rlvr.rollouts.verifiers import load_any
from art_rlvr.run import machine_problem, mode_problem

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
README_MAX_LINES = 250
README_MAX_WORDS = 1300  # five minutes at ~250 words a minute
ARCHITECTURE = ROOT / "docs" / "architecture.md"
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
# top-level folders whose paths the docs may name; `runs/...` is a run's output, not the repo's
REPO_DIRS = ("art_rlvr", "benchmarks", "docs", "notebooks", "scenarios", "tests", ".ci")
REPO_PATH = re.compile(
    rf"(?<![\w./-])((?:{'|'.join(re.escape(d) for d in REPO_DIRS)})/[\w./-]*\w)(?:::(\w+))?"
)
BARE_TEST_FILE = re.compile(r"(?<![\w/.-])(test_\w+\.py)(?:::(\w+))?")
FENCE = re.compile(r"^\s*(```|~~~)\s*([\w+-]*)")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)\)")


def blocks(text: str) -> tuple[list[tuple[int, str, str]], list[tuple[int, str]]]:
    """(first line, fence language, body) of each fenced block; (line, text) of all other lines."""
    fenced: list[tuple[int, str, str]] = []
    prose: list[tuple[int, str]] = []
    open_at, lang, body = 0, "", []
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if open_at and match:
            fenced.append((open_at, lang, "\n".join(body)))
            open_at, body = 0, []
        elif open_at:
            body.append(line)
        elif match:
            open_at, lang = number + 1, match.group(2).lower()
        else:
            prose.append((number, line))
    assert not open_at, f"a code fence opened at line {open_at - 1} is never closed"
    return fenced, prose


def simple_commands(shell: str) -> list[list[str]]:
    """Words of each simple command in a shell snippet: continuations joined, comments dropped,
    split at line ends, `&&`, `||`, `;`, `|` and parentheses."""
    commands: list[list[str]] = [[]]
    for line in shell.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split, lexer.commenters = True, "#"
        commands.append([])
        for word in lexer:
            if set(word) <= set("&|;()"):
                commands.append([])
            else:
                commands[-1].append(word)
    return [c for c in commands if c]


def entry_point(words: list[str]) -> tuple[str, list[str]] | None:
    """`... python -m art_rlvr.X args` -> (module, args); None for any other command."""
    for i, word in enumerate(words[:-1]):
        if word == "-m" and words[i + 1].startswith("art_rlvr"):
            interpreter = Path(words[i - 1]).name if i else ""
            assert interpreter in ("python", "python3"), f"run it with python -m: {words}"
            return words[i + 1], words[i + 2 :]
    return None


def shell_snippets(doc: Path) -> list[tuple[int, str]]:
    """(line, text) of every shell code block and of every inline code span that runs art_rlvr."""
    fenced, prose = blocks(doc.read_text())
    snippets = [(start, body) for start, lang, body in fenced if lang in SHELL_FENCES]
    # a table cell or a sentence may show a command inline
    snippets += [
        (number, code)
        for number, line in prose
        for code in INLINE_CODE.findall(line)
        if "-m art_rlvr" in code
    ]
    return snippets


def documented_commands() -> list[tuple[str, str, list[str]]]:
    found = []
    for doc in DOCS:
        for line, snippet in shell_snippets(doc):
            for words in simple_commands(snippet):
                if (hit := entry_point(words)) is not None:
                    where = f"{doc.relative_to(ROOT)}:{line}"
                    found.append((where, *hit))
    return found


COMMANDS = documented_commands()


def test_the_docs_hold_commands_to_check() -> None:
    """A docs test that finds nothing to check would pass forever; it must not."""
    modules = {module for _, module, _ in COMMANDS}
    assert len(COMMANDS) >= 20, f"only {len(COMMANDS)} art_rlvr commands found in {DOCS}"
    assert {"art_rlvr.run", "art_rlvr.report", "art_rlvr.compare"} <= modules, modules
    assert any(where.startswith("README.md") for where, _, _ in COMMANDS)


@pytest.mark.parametrize(
    ("where", "module", "args"),
    COMMANDS,
    ids=[f"{w} {m.removeprefix('art_rlvr.')} {' '.join(a)}"[:120] for w, m, a in COMMANDS],
)
def test_documented_command_is_valid(where: str, module: str, args: list[str]) -> None:
    spec = importlib.util.find_spec(module)
    assert spec is not None, f"{where}: no module {module}"
    if spec.submodule_search_locations is not None:  # a package runs through its __main__
        assert importlib.util.find_spec(f"{module}.__main__"), f"{where}: {module} has no __main__"
    if module == "art_rlvr.run":
        config = parse_args(args)  # raises ConfigError with the CLI's own message (renamed keys)
        scenario = load_any(config.scenario, seed=config.seed, overrides=config.source_overrides)
        assert mode_problem(config, scenario) is None, f"{where}: {mode_problem(config, scenario)}"


@cache
def functions_in(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text())
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef)
    return frozenset(node.name for node in ast.walk(tree) if isinstance(node, kinds))


def named_paths(doc: Path) -> list[tuple[int, str, str | None]]:
    """(line, repo-relative path, test name after `::`) for every path the doc names."""
    found = []
    for number, line in enumerate(doc.read_text().splitlines(), 1):
        found += [(number, m[1], m[2]) for m in REPO_PATH.finditer(line)]
        found += [(number, f"tests/{m[1]}", m[2]) for m in BARE_TEST_FILE.finditer(line)]
    return found


def links(doc: Path) -> list[tuple[int, str]]:
    """(line, target) of every relative Markdown link outside code blocks."""
    prose = blocks(doc.read_text())[1]
    found = [(number, target) for number, text in prose for target in LINK.findall(text)]
    return [(number, target) for number, target in found if not re.match(r"[a-z]+:", target)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its rendered text, lower case, punctuation dropped."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).replace("`", "")
    return re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")


def anchors(doc: Path) -> set[str]:
    _, prose = blocks(doc.read_text())
    return {slug(line.lstrip("#")) for _, line in prose if line.startswith("#")}


DOC_IDS = [str(d.relative_to(ROOT)) for d in DOCS]


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_named_paths_and_tests_exist(doc: Path) -> None:
    missing = []
    for line, name, test in named_paths(doc):
        if "*" in name:
            continue  # a glob over output files
        path = ROOT / name
        if not path.exists():
            missing.append(f"line {line}: {name}")
        elif test is not None and test not in functions_in(path):
            missing.append(f"line {line}: {name}::{test} (no such test)")
    assert not missing, f"{doc.relative_to(ROOT)} names what does not exist:\n" + "\n".join(missing)


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_links_resolve(doc: Path) -> None:
    broken = []
    for line, target in links(doc):
        file_part, _, anchor = target.partition("#")
        linked = (doc.parent / file_part).resolve() if file_part else doc
        if not linked.exists():
            broken.append(f"line {line}: {target}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"line {line}: {target} (no such heading)")
    assert not broken, f"{doc.relative_to(ROOT)} has broken links:\n" + "\n".join(broken)


def test_readme_reads_in_five_minutes() -> None:
    text = README.read_text()
    lines, words = len(text.splitlines()), len(text.split())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"
    assert words <= README_MAX_WORDS, f"README.md has {words} words (at most {README_MAX_WORDS})"


def test_readme_shows_the_command_ci_runs() -> None:
    """CI runs the README's test command; the two must be the same bytes."""
    ci = [
        line
        for line in (ROOT / ".ci" / "run").read_text().splitlines()
        if line and not line.startswith(("#", "set ", "cd "))
    ]
    assert len(ci) == 1, ci
    assert ci[0] in README.read_text().splitlines()


def test_cli_reference_tables_are_the_generated_ones() -> None:
    """docs/cli.md's key tables come from the config models' field descriptions (one source for
    every default); a key added, renamed or re-described shows up here until the page is redone."""
    from art_rlvr.config.reference import reference_markdown

    assert reference_markdown() in (ROOT / "docs" / "cli.md").read_text(), (
        "docs/cli.md's key tables differ from `uv run python -m art_rlvr.config.reference`: "
        "paste its output between the page's generated-table markers"
    )


def python_blocks() -> list[tuple[str, str]]:
    return [
        (f"{doc.relative_to(ROOT)}:{line}", body)
        for doc in DOCS
        for line, lang, body in blocks(doc.read_text())[0]
        if lang == "python"
    ]


PYTHON_BLOCKS = python_blocks()


@pytest.mark.parametrize(("where", "code"), PYTHON_BLOCKS, ids=[w for w, _ in PYTHON_BLOCKS])
def test_python_example_compiles_and_imports_what_exists(where: str, code: str) -> None:
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    tree = compile(code, where, "exec", flags=flags)  # a notebook cell: top-level await is fine
    imports = [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("art_rlvr")
        for alias in node.names
    ]
    missing = [f"{m}.{n}" for m, n in imports if not hasattr(importlib.import_module(m), n)]
    assert not missing, f"{where} imports names that do not exist: {missing}"


def layer_test() -> object:
    spec = importlib.util.spec_from_file_location("layer_test", ROOT / "tests" / "test_layers.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def enforced_layers() -> list[tuple[str, set[str]]]:
    """`tests/test_layers.py`'s order: (name, public modules) per layer."""
    return [
        (name, {m for m in members if not m.startswith("_")})
        for name, members in layer_test().LAYERS  # type: ignore[attr-defined]
    ]


def diagram_layers() -> list[set[str]]:
    """docs/architecture.md's layer diagram: the `N name   module, module` lines of the text
    block under its Layers heading."""
    layers = ARCHITECTURE.read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    diagram = next(body for _, lang, body in blocks(layers)[0] if lang == "text")
    rows = [re.match(r"\s*(\d+)\s+\S.*?\s{2,}(\S.*)$", line) for line in diagram.splitlines()]
    return [{m.strip() for m in row.group(2).split(",")} for row in rows if row]


def test_the_layer_diagram_is_the_enforced_order() -> None:
    """`tests/test_layers.py` holds the order it enforces; docs/architecture.md draws the same."""
    assert diagram_layers() == [members for _, members in enforced_layers()]


def test_the_layer_table_names_every_module_in_its_layer() -> None:
    """Each row of the architecture's layer table names every module of its layer by path, so
    a module the page leaves out (or files under the wrong layer, or calls future work) fails."""
    layers = ARCHITECTURE.read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = {
        int(m[1]): m[2]
        for line in layers.splitlines()
        if (m := re.match(r"\| (\d+) [^|]+\|([^|]+)\|", line))
    }
    missing = []
    for number, (name, members) in enumerate(enforced_layers(), start=1):
        for module in sorted(members - {"__init__", "__main__"}):
            paths = (f"art_rlvr/{module}.py", f"art_rlvr/{module}/")
            if not any(path in rows.get(number, "") for path in paths):
                missing.append(f"layer {number} ({name}): art_rlvr/{module}")
    assert not missing, "docs/architecture.md's layer table leaves out:\n" + "\n".join(missing)


def test_every_notebook_is_listed() -> None:
    for doc in (README, ROOT / "docs" / "runs.md"):
        text = doc.read_text()
        unlisted = [p.name for p in (ROOT / "notebooks").glob("*.ipynb") if p.name not in text]
        assert not unlisted, f"{doc.relative_to(ROOT)} does not list {unlisted}"


ISSUE_NUMBER = re.compile(r"\b(?:issues?|PR)\s*#?\d+|(?<![\w/&(])#\d+\b", re.IGNORECASE)
# claims that were true once and went stale (patterns); a doc that makes one again is wrong
STALE = [
    (r"no streaming", "the server streams (`stream=true`)"),
    (r"no tool calling", "the server takes `tools` and `tool_choice`"),
    (r"future work", "say what is not done in docs/status.md, plainly"),
    (r"has no script|\bno script\b", "the report has the browser's inline script"),
    (r"\b(three|3) notebooks|all three headlessly", "there are four notebooks"),
    (r"resume their own way", "GEPA and the eval journal resume through rundir/journal.py"),
]


@pytest.mark.parametrize("doc", DOCS, ids=DOC_IDS)
def test_no_issue_numbers_or_stale_claims(doc: Path) -> None:
    """A reader cannot look up an issue number; and a claim found stale must not come back."""
    _, prose = blocks(doc.read_text())
    found = [f"line {n}: {m[0]!r}" for n, line in prose for m in ISSUE_NUMBER.finditer(line)]
    lowered = doc.read_text().lower()
    found += [f"{m[0]!r} ({why})" for pattern, why in STALE if (m := re.search(pattern, lowered))]
    assert not found, f"{doc.relative_to(ROOT)}:\n" + "\n".join(found)


def test_the_served_features_the_docs_name_exist() -> None:
    """docs/export.md says `serve` streams and calls tools: the request model it serves with
    takes those fields, and `serve` uses TorchBackend's own app."""
    from art_rlvr.backend.serving.chat_request import ChatRequest

    text = (ROOT / "docs" / "export.md").read_text()
    for field in ("stream", "tools", "tool_choice", "response_format"):
        assert field in ChatRequest.model_fields
        assert f"`{field}" in text, field
    assert ".serve_on(" in (ROOT / "art_rlvr" / "serve.py").read_text()


def cli_error_examples() -> list[tuple[str, list[str], str]]:
    """(where, args, message) of each `$ python -m art_rlvr.run ...` line of a text block in
    docs/cli.md and the `error: ...` line after it."""
    doc = ROOT / "docs" / "cli.md"
    found = []
    for start, lang, body in blocks(doc.read_text())[0]:
        lines = body.splitlines()
        for n, (line, after) in enumerate(itertools.pairwise(lines)):
            if lang == "text" and line.startswith("$ python -m art_rlvr.run"):
                assert after.startswith("error: "), after
                found.append((f"docs/cli.md:{start + n}", shlex.split(line)[4:], after[7:]))
    return found


CLI_ERRORS = cli_error_examples()


@pytest.mark.parametrize(
    ("where", "args", "message"), CLI_ERRORS, ids=[w for w, _, _ in CLI_ERRORS]
)
def test_the_documented_errors_are_what_the_cli_says(
    where: str, args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI's checks, run as `main` runs them before anything loads, on a machine with no
    provider key set; `...` in the doc stands for text left out."""
    assert len(CLI_ERRORS) >= 5
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    try:
        config = parse_args(args)
        scenario = load_any(config.scenario, seed=config.seed, overrides=config.source_overrides)
        said = mode_problem(config, scenario) or machine_problem(config)
    except ValueError as error:  # ConfigError, ScenarioFileError
        said = str(error)
    pattern = ".*".join(re.escape(part) for part in message.split("..."))
    assert said is not None and re.fullmatch(pattern, said), f"{where}: the CLI says {said!r}"


def test_the_import_picture_is_the_code() -> None:
    """docs/architecture.md's mermaid picture is the package import graph as it is today."""
    layers = ARCHITECTURE.read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    drawn = next(body for _, lang, body in blocks(layers)[0] if lang == "mermaid")
    assert drawn.strip() == layer_test().mermaid(), (  # type: ignore[attr-defined]
        "the picture in docs/architecture.md is stale: paste tests/test_layers.py's mermaid()"
    )
