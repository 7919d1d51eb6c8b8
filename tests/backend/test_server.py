"""The OpenAI-compatible endpoint, exercised over real HTTP on loopback."""

import asyncio
import http.client
import time
from urllib.parse import urlparse

import httpx
import openai
import pytest
import torch

from art_rlvr.backend.engine.generation import SamplingParams, sample_tokens

MESSAGES = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]


async def create(model, **kwargs):
    return await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=kwargs.pop("messages", MESSAGES), **kwargs
    )


async def test_listens_on_loopback_only_and_lists_models(model) -> None:
    url = urlparse(model.inference_base_url)
    assert url.hostname == "127.0.0.1"
    listing = await model.openai_client().models.list()
    assert model.get_inference_name() in [m.id for m in listing.data]


HTTPX_KEEPALIVE_EXPIRY = 5.0  # httpx.Limits' default, the OpenAI SDK's transport


async def test_an_idle_connection_outlives_the_clients_keepalive_expiry(model) -> None:
    """A pooled connection idle for longer than httpx's expiry is still served: the client
    retires it first, never the server while a request is on its way (uvicorn's default of
    5 s made busy benchmarks fail with httpx.ReadError)."""
    assert httpx.Limits().keepalive_expiry == HTTPX_KEEPALIVE_EXPIRY
    url = urlparse(model.inference_base_url)
    headers = {"Authorization": f"Bearer {model.inference_api_key}"}

    def two_requests_on_one_connection() -> list[tuple[int, object]]:
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
        answers = []
        for pause in (0.0, HTTPX_KEEPALIVE_EXPIRY + 1):
            time.sleep(pause)
            connection.request("GET", "/v1/models", headers=headers)
            response = connection.getresponse()  # RemoteDisconnected had the server closed it
            response.read()
            answers.append((response.status, connection.sock))
        connection.close()
        return answers

    (first, sock), (second, same_sock) = await asyncio.to_thread(two_requests_on_one_connection)
    assert (first, second) == (200, 200) and same_sock is sock  # one connection, kept open


async def test_n_choices_with_token_metadata_and_usage(model) -> None:
    response = await create(model, n=3, max_tokens=12, logprobs=True, temperature=1.0)
    assert len(response.choices) == 3
    total = 0
    for choice in response.choices:
        extra = choice.model_extra
        assert extra["prompt_token_ids"] and extra["token_ids"]
        assert len(choice.logprobs.content) == len(extra["token_ids"])
        assert all(
            t.token.startswith("token_id:") and t.logprob <= 0 for t in choice.logprobs.content
        )
        total += len(extra["token_ids"])
    assert response.usage.completion_tokens == total
    assert response.usage.prompt_tokens == len(response.choices[0].model_extra["prompt_token_ids"])


async def test_max_tokens_gives_length_finish(model) -> None:
    response = await create(model, max_tokens=5, temperature=0)
    choice = response.choices[0]
    assert choice.finish_reason == "length" and len(choice.model_extra["token_ids"]) == 5


async def test_stop_sequence_cuts_text(model) -> None:
    response = await create(model, max_tokens=60, temperature=0, stop=["5"])
    choice = response.choices[0]
    assert "5" not in choice.message.content
    assert choice.finish_reason == "stop"
    assert "4" in choice.message.content


async def test_seed_makes_sampling_reproducible(model) -> None:
    a = await create(model, max_tokens=16, temperature=1.0, seed=123)
    b = await create(model, max_tokens=16, temperature=1.0, seed=123)
    c = await create(model, max_tokens=16, temperature=1.0, seed=124)
    assert a.choices[0].model_extra["token_ids"] == b.choices[0].model_extra["token_ids"]
    assert a.choices[0].model_extra["token_ids"] != c.choices[0].model_extra["token_ids"]


async def test_greedy_is_deterministic_and_top_p_small_is_greedy(model) -> None:
    a = await create(model, max_tokens=12, temperature=0)
    b = await create(model, max_tokens=12, temperature=1.0, top_p=1e-6)
    assert a.choices[0].message.content == b.choices[0].message.content


async def test_32_concurrent_requests_are_batched(model, backend) -> None:
    engine = next(iter(backend._bases.values())).engine
    before = engine.stats.max_batch_rows
    started = time.perf_counter()
    results = await asyncio.gather(
        *[create(model, max_tokens=16, temperature=1.0, seed=i) for i in range(32)]
    )
    assert len(results) == 32 and all(r.choices[0].model_extra["token_ids"] for r in results)
    assert max(before, engine.stats.max_batch_rows) >= 16
    assert time.perf_counter() - started < 120


async def arrive_apart(engine, prompt: list[int], count: int, gap: float) -> None:
    """`count` requests `gap` seconds apart, as a burst of HTTP requests reaches the engine."""
    scenarios = []
    for i in range(count):
        params = SamplingParams(max_tokens=2, temperature=1.0, seed=i)
        scenarios.append(asyncio.create_task(engine.generate(prompt, params, adapter=None)))
        await asyncio.sleep(gap)
    await asyncio.gather(*scenarios)


@pytest.mark.parametrize(
    ("window", "prefills"),
    [(None, "one"), (0.01, "several")],
    ids=[
        "the default window takes a burst 8 ms apart whole",
        "a steady stream is cut at 8 windows",
    ],
)
async def test_a_burst_of_requests_shares_one_prefill(
    model, backend, make_engine, window, prefills
):
    """A GRPO step's requests reach the engine a few ms apart: they are prefilled together
    (one prefill, no row a step behind), but arrivals that keep coming do not hold the first
    prefill back beyond eight windows."""
    base = next(iter(backend._bases.values()))
    engine = make_engine(**({} if window is None else {"coalesce_seconds": window}))
    try:
        prompt = base.tokenizer.apply_chat_template(
            [{"role": "user", "content": "What is 2 + 2?"}], add_generation_prompt=True
        )["input_ids"]
        await arrive_apart(engine, prompt, 1, 0)  # the engine started (it times its threads)
        before = engine.stats.prefills
        await arrive_apart(engine, prompt, 16, 0.008)
        if prefills == "one":
            assert (engine.stats.prefills - before, engine.stats.max_batch_rows) == (1, 16)
        else:  # 16 arrivals over ~130 ms against an 80 ms cap
            assert engine.stats.prefills - before >= 2
    finally:
        engine.close()


def logprob_tolerance(backend) -> float:
    """fp32 on CPU agrees to 2e-3 whatever the batch; bf16 on CUDA does not: its kernels
    depend on the batch's shape, and an H100 gave up to 0.067 between a prompt alone and the
    same prompt batched with others."""
    return 2e-3 if backend.dtype == torch.float32 else 0.15


async def test_a_shared_prompt_prefix_is_computed_once_with_the_same_result(
    model, backend, make_engine
):
    """Distinct prompts that share a system prompt, sent together: on an engine that is not
    batch-invariant the shared prefix is run once (the engine counts the tokens it skipped) and
    every greedy completion and its logprobs match the same prompt sent alone."""
    base = next(iter(backend._bases.values()))
    engine = make_engine(batch_invariant=False)
    system = {"role": "system", "content": "You are a careful calculator. Reply with a number."}
    questions = ["What is 2 + 2?", "What is 17 - 9, exactly?", "Add 3 and 40.", "What is 6+1?"]
    prompts = [
        base.tokenizer.apply_chat_template(
            [system, {"role": "user", "content": q}], add_generation_prompt=True
        )["input_ids"]
        for q in questions
    ]
    greedy = SamplingParams(max_tokens=6, temperature=0)
    try:
        alone = [(await engine.generate(p, greedy, adapter=None))[0] for p in prompts]
        together = await asyncio.gather(
            *[engine.generate(p, greedy, adapter=None) for p in prompts]
        )
        assert engine.stats.prefix_tokens_saved >= 3 * 8
    finally:
        engine.close()
    for a, (b,) in zip(alone, together, strict=True):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=logprob_tolerance(backend))


async def test_the_cpu_engine_is_batch_invariant(model, backend):
    """The same prompts through the backend's own engine, alone and together with arrivals
    staggered across decode steps: no shared prefix (a prompt's cache must not depend on its
    neighbours) and bit-identical seeded tokens and logprobs."""
    engine = next(iter(backend._bases.values())).engine
    if not engine.batch_invariant:
        pytest.skip("batch-invariant decoding is the CPU engine's; this engine batches freely")
    chats = [
        [
            {"role": "system", "content": "You are a careful calculator."},
            {"role": "user", "content": q},
        ]
        for q in ["What is 17 times 23?", "2+2?", "Write a haiku about rain on a tin roof."]
    ]
    settings = {"max_tokens": 12, "temperature": 1.0, "seed": 5, "n": 2, "logprobs": True}

    def record(reply):
        return [
            (c.model_extra["token_ids"], [t.logprob for t in c.logprobs.content])
            for c in reply.choices
        ]

    async def later(i, messages):
        await asyncio.sleep(0.1 * i)
        return await create(model, messages=messages, **settings)

    saved = engine.stats.prefix_tokens_saved
    alone = [record(await create(model, messages=m, **settings)) for m in chats]
    together = [
        record(r) for r in await asyncio.gather(*[later(i, m) for i, m in enumerate(chats)])
    ]
    assert engine.stats.prefix_tokens_saved == saved
    assert alone == together


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"messages": MESSAGES, "tools": [{"type": "function"}]}, 400, "tools.0.function"),
        ({"messages": MESSAGES, "stream": True, "max_tokens": 100_000}, 400, "context length"),
        ({"messages": MESSAGES, "stream": True, "model": "nope@0"}, 404, "not served here"),
        ({"messages": []}, 400, "messages"),
        ({"messages": MESSAGES, "n": 0}, 400, "n"),
        ({"messages": MESSAGES, "temperature": -1}, 400, "temperature"),
        ({"messages": MESSAGES, "max_tokens": 100_000}, 400, "context length"),
        ({"messages": MESSAGES, "model": "nope@0"}, 404, "not served here"),
        ({"messages": MESSAGES, "model": "MODEL@999"}, 404, "has no checkpoint"),
    ],
)
async def test_bad_requests_get_clear_4xx(model, body, status, message) -> None:
    payload = {"model": model.get_inference_name(), **body}
    if payload["model"] == "MODEL@999":
        payload["model"] = f"{model.name}@999"
    async with httpx.AsyncClient(
        base_url=model.inference_base_url,
        headers={"Authorization": f"Bearer {model.inference_api_key}"},
    ) as client:
        response = await client.post("/chat/completions", json=payload, timeout=60)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]["message"]


async def test_auth_and_body_size_limit(model) -> None:
    async with httpx.AsyncClient(base_url=model.inference_base_url) as client:
        assert (await client.get("/models")).status_code == 401
        headers = {"Authorization": f"Bearer {model.inference_api_key}"}
        huge = {
            "model": model.get_inference_name(),
            "messages": [{"role": "user", "content": "x" * 5_000_000}],
        }
        response = await client.post("/chat/completions", json=huge, headers=headers, timeout=60)
        assert response.status_code == 413


async def test_openai_client_surfaces_errors(model) -> None:
    with pytest.raises(openai.NotFoundError):
        await model.openai_client().chat.completions.create(model="nope", messages=MESSAGES)


SAMPLING_LOGITS = [[2.0, 1.0, 0.0, -1.0, float("-inf")]]


@pytest.mark.parametrize(
    ("temperature", "top_p", "expected"),
    [
        (1.0, 1.0, torch.softmax(torch.tensor(SAMPLING_LOGITS[0]), -1).tolist()),
        (0.5, 1.0, torch.softmax(torch.tensor(SAMPLING_LOGITS[0]) / 0.5, -1).tolist()),
        # top-p 0.8 keeps the two most likely tokens (0.64 + 0.24 covers it), renormalised
        (1.0, 0.8, [0.731, 0.269, 0.0, 0.0, 0.0]),
        (0.0, 1.0, [1.0, 0.0, 0.0, 0.0, 0.0]),
    ],
)
def test_sample_tokens_follows_the_tempered_filtered_distribution(
    temperature: float, top_p: float, expected: list[float]
) -> None:
    """20k draws through the engine's sampler (one uniform per row): frequencies within 0.015
    of the target distribution, and a token of zero mass is never drawn, at u = 0 included."""
    rows = 20_000
    uniform = torch.rand(rows, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    uniform[0] = 0.0
    tokens = sample_tokens(
        torch.tensor(SAMPLING_LOGITS * rows),
        temperature=torch.full((rows,), temperature),
        top_p=torch.full((rows,), top_p),
        uniform=uniform,
    )
    frequencies = torch.bincount(tokens, minlength=5).double() / rows
    assert frequencies.tolist() == pytest.approx(expected, abs=0.015)
    assert frequencies[4] == 0


async def test_a_failed_prefill_fails_its_requests_and_the_engine_goes_on(model, backend):
    """A request whose prefill raises (a token id outside the vocabulary) gets the error
    instead of waiting forever, and the engine serves the next request."""
    engine = next(iter(backend._bases.values())).engine
    greedy = SamplingParams(max_tokens=2, temperature=0)
    with pytest.raises(IndexError):
        await asyncio.wait_for(engine.generate([10**9], greedy, adapter=None), timeout=120)
    (ok,) = await asyncio.wait_for(engine.generate([1, 2, 3], greedy, adapter=None), timeout=120)
    assert len(ok.token_ids) >= 1
