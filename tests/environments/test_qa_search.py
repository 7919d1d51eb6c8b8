"""`qa_search`: the shipped data is what its generator writes and every question is answerable
from two passages; the real BM25 index finds them; scripted episodes through the real
environment (over loopback, the scripted server) score EM / F1 and support recall, and bad tool
calls are messages to the model, counted, with nothing lost. No model is loaded here."""

from __future__ import annotations

import importlib.util
import json
import textwrap
from pathlib import Path

import art
import pytest

from art_rlvr import load_scenario
from art_rlvr.core.outcome import feedback_of, turns
from art_rlvr.rollouts.rollout import rollout
from art_rlvr.scenarios.environments.qa_search import Corpus, read_corpus, shipped, shown_ids
from art_rlvr.scenarios.sources import ScenarioFileError
from art_rlvr.testing import ScriptedServer, Step

DATA = Path(__file__).resolve().parents[2] / "scenarios" / "data"


@pytest.fixture(scope="module")
def scenario():
    return load_scenario("qa_search", seed=0)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    return Corpus(passages=tuple(read_corpus(shipped("qa_search_corpus.jsonl"))))


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return [json.loads(line) for line in (DATA / "qa_search.jsonl").read_text().splitlines()]


def scripted_model(server: ScriptedServer) -> art.Model:
    return art.Model(
        name="scripted", project="t", inference_base_url=server.base_url,
        inference_api_key="k", inference_model_name="scripted",
    )  # fmt: skip


def by_id(scenario, ident: str):
    return next(s for split in scenario.splits.values() for s in split if s.id == ident)


# ---- the shipped data ---------------------------------------------------------------------


def test_the_shipped_files_are_what_the_generator_writes(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("gen", DATA / "qa_search_generate.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    gen.HERE = tmp_path
    gen.main()
    for name in ("qa_search.jsonl", "qa_search_corpus.jsonl"):
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name
    assert (
        sum((DATA / n).stat().st_size for n in ("qa_search.jsonl", "qa_search_corpus.jsonl")) < 1e6
    )


def test_every_question_needs_two_passages(corpus: Corpus, records: list[dict]) -> None:
    texts = {p.id: f"{p.title} {p.text}" for p in corpus.passages}
    assert len(records) == 240 and len(texts) == 600
    for r in records:
        first, second = r["support"]
        assert r["answers"][0] in texts[second] and r["answers"][0] not in texts[first]
        assert r["answers"][0] not in r["question"]
        hop = next(p.title for p in corpus.passages if p.id == second)
        assert hop in texts[first] and hop not in r["question"]  # the link is in passage 1 only


def test_bm25_finds_each_hop_by_name(corpus: Corpus, records: list[dict]) -> None:
    titles = {p.id: p.title for p in corpus.passages}
    for r in records:
        for pid in r["support"]:
            assert f"[{pid}]" in corpus.search(titles[pid], k=3), (r["id"], pid)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda c: c.search(""), "no searchable words"),
        (lambda c: c.search("the of and"), "no searchable words"),  # stop words only
        (lambda c: c.read("p9999"), "no passage has the id 'p9999'"),
        (lambda c: c.read(""), "no passage has the id ''"),
    ],
)
def test_tools_refuse_with_a_reason(corpus: Corpus, call, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        call(corpus)


def test_a_query_without_matches_says_so(corpus: Corpus) -> None:
    assert corpus.search("zzzqqq xyzzy").startswith("No passage matches 'zzzqqq xyzzy'")
    assert corpus.read("[p0001]").startswith("[p0001] ")  # ids are read as search shows them


# ---- episodes through the real environment, scripted replies over loopback ------------------


def oracle_script(scenario, sc) -> list[Step]:
    """Search the entity, then the name its passage gives, then answer: the intended path."""
    corpus_titles = {p.id: p.title for p in read_corpus(shipped("qa_search_corpus.jsonl"))}
    first, second = sc.x["support"]
    return [
        Step.calls(("search", {"query": corpus_titles[first]})),
        Step.calls(("search", {"query": corpus_titles[second], "k": 2})),
        Step.reply(f"The answer is {sc.x['answers'][0]}."),
    ]


async def test_two_searches_then_the_answer(scenario) -> None:
    sc = by_id(scenario, "qs-000")
    with ScriptedServer(oracle_script(scenario, sc)) as server:
        t = await rollout(scripted_model(server), sc)
        requests = server.chat_requests
    assert t.reward == 1.0 and t.metrics["em"] == 1.0 and t.metrics["f1"] == 1.0
    assert t.metrics["support_recall"] == 1.0 and t.metrics["tool_calls"] == 2
    assert t.metrics["tool_errors"] == 0 and t.metrics["turns"] == 3
    assert [t_["function"]["name"] for t_ in t.tools] == ["search", "read"]
    first_choice = requests[0].body["tool_choice"]
    assert first_choice == {"type": "function", "function": {"name": "search"}}
    assert "tool_choice" not in requests[1].body  # named choice only until the first call
    tool_said = [m["content"] for m in turns(t) if m["role"] == "tool"]
    assert set(sc.x["support"]) <= shown_ids(turns(t)) and len(tool_said) == 2


@pytest.mark.parametrize(
    ("answer", "em", "f1"),
    [
        ("Old Westerhaven", 1.0, 1.0),
        ("It was Westerhaven.", 0.0, 0.4),
        ("Pell Harbor", 0.0, 0.0),
        ("", 0.0, 0.0),
    ],
)
async def test_one_search_answers_scored_by_em_and_f1(scenario, answer, em, f1) -> None:
    sc = by_id(scenario, "qs-000")
    assert sc.x["answers"] == ["Old Westerhaven"]
    script = [Step.calls(("search", {"query": "Old Elmmoor Bridge"})), Step.reply(answer)]
    with ScriptedServer(script) as server:
        t = await rollout(scripted_model(server), sc)
    assert (t.metrics["em"], round(t.metrics["f1"], 2), t.reward) == (em, f1, pytest.approx(f1))
    assert t.metrics["support_recall"] == 0.5  # the bridge's passage, not the designer's


@pytest.mark.parametrize(
    ("call", "status", "said"),
    [
        (
            ("search", {"q": "Old Elmmoor Bridge"}),
            "tool_invalid_arguments",
            "do not match its schema",
        ),
        (
            ("search", {"query": "Elmmoor", "k": 50}),
            "tool_invalid_arguments",
            "less than or equal to 10",
        ),
        (("search", {"query": 7}), "tool_invalid_arguments", "valid string"),
        (("search", '{"query": "Elmmoor"'), "tool_invalid_arguments", "not valid JSON"),
        (("search", {"query": ""}), "tool_errors", "no searchable words"),
        (("search", {"query": "  the  "}), "tool_errors", "no searchable words"),
        (("read", {"doc_id": "p9999"}), "tool_errors", "no passage has the id 'p9999'"),
        (("lookup", {"query": "Elmmoor"}), "tool_unknown", "unknown tool 'lookup'"),
    ],
)
async def test_bad_tool_calls_are_told_and_counted(scenario, call, status: str, said: str) -> None:
    sc = by_id(scenario, "qs-000")
    script = [Step.calls(call), Step.reply("Old Westerhaven")]
    with ScriptedServer(script) as server:
        t = await rollout(scripted_model(server), sc)
        requests = server.chat_requests
    assert t.metrics[status] == 1 and t.metrics["tool_errors"] == 1
    sent = [m for m in requests[1].messages if m["role"] == "tool"]
    assert sent and said in sent[0]["content"]  # the model saw what went wrong
    assert t.reward == 1.0 and t.metrics["turns"] == 2  # and the episode went on


async def test_a_model_that_only_searches_hits_the_turn_cap(scenario) -> None:
    sc = by_id(scenario, "qs-000")
    with ScriptedServer([], default=Step.calls(("search", {"query": "Elmmoor"}))) as server:
        t = await rollout(scripted_model(server), sc)
        n = len(server.chat_requests)
    assert n == 4 and t.metrics["turn_cap_hit"] == 1 and t.reward == 0.0
    assert feedback_of(t) == "empty answer"


async def test_without_the_tool_it_is_one_closed_book_reply() -> None:
    scenario = load_scenario("qa_search_notool", seed=0)
    sc = by_id(scenario, "qs-000")
    with ScriptedServer([Step.reply("Old Westerhaven")]) as server:
        t = await rollout(scripted_model(server), sc)
        body = server.chat_requests[0].body
    assert "tools" not in body and not t.tools and t.metrics["turns"] == 1
    assert t.reward == 1.0 and t.metrics["em"] == 1.0 and t.metrics["support_recall"] == 0.0
    assert [s.id for s in scenario.splits["val"]] == [
        s.id for s in load_scenario("qa_search", seed=0).splits["val"]
    ]  # the same questions with and without the tool


# ---- bad [environment] params --------------------------------------------------------------

HEAD = """name = "t"
user_template = "{question}"
[source]
type = "jsonl"
path = "%s"
splits = { train = 1, val = 1, test = 1 }
[environment]
name = "qa_search"
"""


@pytest.mark.parametrize(
    ("corpus_lines", "params", "message"),
    [
        (None, '{ corpus = "nowhere.jsonl" }', "corpus nowhere.jsonl not found"),
        (['{"id": "a", "text": "x"}', "not json"], None, "c.jsonl:2: not a passage"),
        (['{"id": "a b", "text": "x"}'], None, "c.jsonl:1: not a passage"),
        (['{"id": "a", "title": "t"}'], None, "c.jsonl:1: not a passage"),
        (['{"id": "a", "text": "x"}', '{"id": "a", "text": "y"}'], None, "passage ids repeat"),
        ([], None, "no passages"),
        (None, "{ surprise = 1 }", "surprise"),
        (None, '{ reward_metric = "bleu" }', "reward_metric"),
    ],
)
def test_bad_environment_params(tmp_path: Path, monkeypatch, corpus_lines, params, message) -> None:
    monkeypatch.chdir(tmp_path)
    if corpus_lines is not None:
        (tmp_path / "c.jsonl").write_text("\n".join(corpus_lines) + "\n")
        params = params or '{ corpus = "c.jsonl" }'
    path = tmp_path / "t.toml"
    path.write_text(textwrap.dedent(HEAD % (DATA / "qa_search.jsonl")) + f"params = {params}\n")
    with pytest.raises(ScenarioFileError, match="bad parameters for environment 'qa_search'") as e:
        load_scenario(str(path))
    assert message in str(e.value) and "\n" not in str(e.value)
