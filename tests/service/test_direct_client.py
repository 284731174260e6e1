"""A job's rollouts reach its in-process policy server without a connection (service/backends/models.py), and are
answered exactly as a client over loopback is."""

from __future__ import annotations

import threading

import httpx
import openai
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from service.backends.embedded import EmbeddedBackend
from service.backends.models import TrainableModel, checkpoint_model

TINY = "embedded/char-gpt-0.2m"
PROMPT = [{"role": "user", "content": "What is 3 + 4?"}]


@pytest_asyncio.fixture
async def registered(tmp_path):
    """A model registered with an embedded backend, which serves in this process; closed after the test."""
    backend = EmbeddedBackend(path=tmp_path / "models", cache_dir=tmp_path / "cache", seed=0)
    model = TrainableModel(name="policy", project="tests", base_model=TINY, base_path=str(tmp_path / "art"))
    await model.register(backend)
    yield backend, model
    await backend.close()


def _requests_served_over_tcp(backend: EmbeddedBackend) -> int:
    return backend._server.server_state.total_requests  # uvicorn's count of the HTTP requests it parsed


@pytest.mark.asyncio
async def test_the_models_client_is_answered_by_the_same_app_without_a_connection(registered):
    backend, model = registered
    client = model.openai_client()
    assert client is model.openai_client()
    over_tcp = AsyncOpenAI(base_url=model.inference_base_url, api_key=model.inference_api_key)
    asked = dict(model=model.get_inference_name(), messages=PROMPT, max_tokens=12, logprobs=True, seed=7,
                 temperature=1.0)  # fmt: skip

    direct = await client.chat.completions.create(**asked)
    assert _requests_served_over_tcp(backend) == 0
    loopback = await over_tcp.chat.completions.create(**asked)
    assert _requests_served_over_tcp(backend) == 1

    assert direct.choices[0].message.content == loopback.choices[0].message.content
    assert direct.choices[0].logprobs == loopback.choices[0].logprobs
    assert direct.model == loopback.model
    await over_tcp.close()


@pytest.mark.asyncio
async def test_the_direct_client_gets_the_servers_errors_and_the_servers_key_check(registered):
    backend, model = registered
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        await model.openai_client().chat.completions.create(model="nobody", messages=PROMPT, max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        await model.openai_client().chat.completions.create(model=model.get_inference_name(), messages=PROMPT,
                                                            max_tokens=-1)  # fmt: skip
    wrong_key = model.openai_client().with_options(api_key="not-the-key")
    with pytest.raises(openai.AuthenticationError):
        await wrong_key.chat.completions.create(model=model.get_inference_name(), messages=PROMPT, max_tokens=4)
    assert _requests_served_over_tcp(backend) == 0


@pytest.mark.asyncio
async def test_after_close_the_direct_client_refuses_as_the_stopped_server_does(registered):
    backend, model = registered
    client = model.openai_client()
    await backend.close()
    assert backend.direct_http_client() is None
    with pytest.raises((openai.APIConnectionError, RuntimeError)):
        await client.chat.completions.create(model=model.get_inference_name(), messages=PROMPT, max_tokens=4)


@pytest.mark.asyncio
async def test_a_backend_without_a_direct_client_is_reached_as_art_reaches_it(tmp_path):
    """A model registered with a backend that serves elsewhere keeps ART's own client."""

    class Elsewhere:
        async def register(self, model):
            pass

        async def _prepare_backend_for_training(self, model, config):
            return "http://127.0.0.1:9/v1", "key"

    model = TrainableModel(name="policy", project="tests", base_model=TINY, base_path=str(tmp_path / "art"))
    await model.register(Elsewhere())  # type: ignore[arg-type]
    client = model.openai_client()
    assert str(client.base_url) == "http://127.0.0.1:9/v1/"
    assert not isinstance(client._client._client._transport, httpx.ASGITransport)


@pytest.mark.asyncio
async def test_a_rollout_that_streams_reads_the_reply_it_would_get_whole_directly_and_over_loopback(registered):
    """The policy server answered ``stream: true`` with a plain body, which OpenAI's client read as no chunks at all."""
    backend, model = registered
    asked = dict(model=model.get_inference_name(), messages=PROMPT, max_tokens=12, logprobs=True, seed=3)
    whole = await model.openai_client().chat.completions.create(**asked)
    over_tcp = AsyncOpenAI(base_url=model.inference_base_url, api_key=model.inference_api_key)
    for client in (model.openai_client(), over_tcp):
        chunks = [chunk async for chunk in await client.chat.completions.create(**asked, stream=True)]
        deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
        assert "".join(d.content or "" for d in deltas) == whole.choices[0].message.content
        finish_reasons = [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices]
        assert finish_reasons[-1] == whole.choices[0].finish_reason
        assert chunks[0].choices[0].logprobs.model_dump() == whole.choices[0].logprobs.model_dump()
    for not_a_boolean in ("yes", 1, [True], {"on": True}):
        with pytest.raises(openai.BadRequestError, match="stream"):
            await model.openai_client().chat.completions.create(**asked, extra_body={"stream": not_a_boolean})
    await over_tcp.close()


@pytest.mark.asyncio
async def test_an_evaluations_checkpoint_model_samples_its_step_through_the_trainables_direct_client(registered):
    backend, model = registered
    checkpoint = checkpoint_model(model, 0)
    reply = await checkpoint.openai_client().chat.completions.create(
        model=checkpoint.get_inference_name(), messages=PROMPT, max_tokens=4, logprobs=True)  # fmt: skip
    assert reply.model == "policy@0" and _requests_served_over_tcp(backend) == 0


@pytest.mark.asyncio
async def test_a_direct_request_that_gets_no_answer_times_out_as_it_would_over_a_socket(registered):
    """httpx's ASGI transport ignores timeouts: a model call that never returned hung its rollout for good."""
    backend, model = registered
    model_thread_free = threading.Event()
    backend._executor.submit(model_thread_free.wait, 30)  # the model thread is busy for 30 s: no batch is sampled
    client = model.openai_client().with_options(timeout=0.5, max_retries=0)
    try:
        with pytest.raises(openai.APITimeoutError):
            await client.chat.completions.create(model=model.get_inference_name(), messages=PROMPT, max_tokens=4)
    finally:
        model_thread_free.set()
    reply = await model.openai_client().chat.completions.create(model=model.get_inference_name(), messages=PROMPT,
                                                                max_tokens=4)  # fmt: skip
    assert reply.choices[0].message.content is not None
