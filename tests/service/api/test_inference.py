"""Chat completions on a trained checkpoint through the service's own POST /v1/chat/completions, with the official
openai client against a real server on loopback: a job's best step or a named one, with logprobs; seeds reproduce;
greedy text is base + adapter's (the adapter is applied); other tenants' jobs and unknown steps are NotFoundError,
embedded jobs ConflictError, unbounded requests BadRequestError, a full queue 503 with Retry-After."""

from __future__ import annotations

import shutil
import threading
import time

import httpx
import openai
import pytest
import torch

from service.backends.transformers import chat
from service.backends.transformers.generation import Generator, SamplingRequest
from service.store.tables import Role
from tests.databases import sqlite_only
from tests.service import adapter_checkpoints as ckpt
from tests.service.api import seeding

pytestmark = sqlite_only

MESSAGES = [{"role": "system", "content": "Reply with `Final: <int>`."}, {"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def adapter(tiny_lm, tmp_path_factory) -> ckpt.Adapter:
    return ckpt.make_adapter(tiny_lm, tmp_path_factory.mktemp("adapter") / "adapter")


@pytest.fixture
def owned(engine) -> tuple[str, str]:
    """A client token: its id and its secret (the openai client's api_key)."""
    owner, headers = seeding.principal(engine)
    return owner, headers["Authorization"].removeprefix("Bearer ")


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)


def token_ids(choice) -> list[int]:
    return [int(entry.token.removeprefix("token_id:")) for entry in choice.logprobs.content]


def trained_job(engine, settings, owner: str, adapter: ckpt.Adapter) -> str:
    """A job with checkpoints at steps 0, 2 and 3, its best validation step 2."""
    job_id = ckpt.new_job(engine, owner_id=owner)
    for step, accuracy in [(0, 0.1), (2, 0.6), (3, 0.4)]:
        seeding.record(engine, job_id, step, accuracy=accuracy)
        ckpt.place(adapter, settings, job_id, step)
    return job_id


def test_the_openai_client_gets_completions_of_the_best_step_or_a_named_one_with_logprobs(
    live_server, engine, settings, owned, adapter
):
    owner, key = owned
    job_id = trained_job(engine, settings, owner, adapter)
    api = client(live_server, key)

    response = api.chat.completions.create(model=job_id, messages=MESSAGES, max_tokens=6, logprobs=True, top_logprobs=2)
    assert response.model == f"{job_id}@2"  # the best validation step
    [choice] = response.choices
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert len(choice.logprobs.content) == response.usage.completion_tokens - (choice.finish_reason == "stop") > 0
    entries = choice.logprobs.content
    assert all(entry.token.startswith("token_id:") and len(entry.top_logprobs) == 2 for entry in entries)
    assert response.usage.prompt_tokens == len(chat.render_prompt(load_tokenizer(adapter), MESSAGES, None))

    for model, served in [(f"{job_id}@3", 3), (f"{job_id}@0", 0), (f"{job_id}@latest", 3), (f"{job_id}@best", 2)]:
        response = api.chat.completions.create(model=model, messages=MESSAGES, max_tokens=3, n=2)
        assert response.model == f"{job_id}@{served}" and len(response.choices) == 2

    unvalidated = ckpt.new_job(engine, owner_id=owner)
    for step in (0, 1):
        ckpt.place(adapter, settings, unvalidated, step)
    assert api.chat.completions.create(model=unvalidated, messages=MESSAGES, max_tokens=1).model == f"{unvalidated}@1"


def test_the_same_seed_gives_the_same_text_and_greedy_text_is_base_plus_adapters(
    live_server, engine, settings, owned, adapter, tiny_lm
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    owner, key = owned
    job_id = trained_job(engine, settings, owner, adapter)
    api = client(live_server, key)

    def sample(**extra) -> list:
        reply = api.chat.completions.create(model=job_id, messages=MESSAGES, max_tokens=12, logprobs=True, **extra)
        return reply.choices

    first, again, other = sample(seed=7, n=2), sample(seed=7, n=2), sample(seed=8, n=2)
    assert [c.message.content for c in first] == [c.message.content for c in again]
    assert [token_ids(c) for c in first] != [token_ids(c) for c in other]

    [greedy] = sample(temperature=0)
    tokenizer = load_tokenizer(adapter)
    prompt = tuple(chat.render_prompt(tokenizer, MESSAGES, None))
    request = SamplingRequest(prompt_ids=prompt, temperature=0, max_tokens=12)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_lm)).eval()
    [[without]] = Generator(base, tokenizer, end_token_ids=chat.end_token_ids(tokenizer)).generate([request])
    tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(str(tiny_lm)), str(adapter.folder)).eval()
    [[direct]] = Generator(tuned, tokenizer, end_token_ids=chat.end_token_ids(tokenizer)).generate([request])
    served_logprobs = torch.tensor([entry.logprob for entry in greedy.logprobs.content])
    assert greedy.message.content == direct.text and token_ids(greedy) == direct.token_ids
    assert torch.allclose(served_logprobs, torch.tensor(direct.logprobs), atol=1e-4)
    assert not torch.allclose(served_logprobs[:1], torch.tensor(without.logprobs[:1]), atol=1e-3)  # the adapter counts


def test_a_checkpoint_written_again_is_loaded_again(live_server, engine, settings, owned, adapter, tiny_lm, tmp_path):
    owner, key = owned
    job_id = ckpt.new_job(engine, owner_id=owner)
    folder = ckpt.place(adapter, settings, job_id, 0)
    api = client(live_server, key)

    def greedy() -> list[float]:
        reply = api.chat.completions.create(model=job_id, messages=MESSAGES, max_tokens=2, temperature=0, logprobs=True)
        return [entry.logprob for entry in reply.choices[0].logprobs.content]

    before = greedy()
    shutil.rmtree(folder)  # as the backend rewrites step 0 after a warm start
    ckpt.place(ckpt.make_adapter(tiny_lm, tmp_path / "other", seed=2), settings, job_id, 0)
    assert greedy() != before


def test_another_tenants_job_an_unknown_job_and_an_unknown_step_are_not_found(
    live_server, engine, settings, owned, adapter
):
    owner, key = owned
    job_id = trained_job(engine, settings, owner, adapter)
    _, stranger_headers = seeding.principal(engine)
    stranger = client(live_server, stranger_headers["Authorization"].removeprefix("Bearer "))
    unknown = "0b6c0b1e-0000-4000-8000-000000000000"
    messages = {}
    for model in (job_id, f"{job_id}@2", unknown):
        with pytest.raises(openai.NotFoundError) as refused:
            stranger.chat.completions.create(model=model, messages=MESSAGES, max_tokens=1)
        assert refused.value.code == "model_not_found"
        messages[model] = refused.value.message
    assert messages[job_id].replace(job_id, unknown) == messages[unknown]  # theirs looks like one that does not exist

    api = client(live_server, key)
    for model in (f"{job_id}@9", f"{job_id}@abc", f"{job_id}@-1", f"{job_id}@99999999999", f"{job_id}@\u00b2", "not-a-job"):
        with pytest.raises(openai.NotFoundError):
            api.chat.completions.create(model=model, messages=MESSAGES, max_tokens=1)
    with pytest.raises(openai.AuthenticationError):
        client(live_server, "not-a-token").chat.completions.create(model=job_id, messages=MESSAGES, max_tokens=1)
    _, operator = seeding.principal(engine, Role.operator)
    as_operator = client(live_server, operator["Authorization"].removeprefix("Bearer "))
    assert as_operator.chat.completions.create(model=job_id, messages=MESSAGES, max_tokens=1).model == f"{job_id}@2"


def test_an_embedded_job_and_a_checkpoint_without_an_adapter_are_conflicts(live_server, engine, settings, owned):
    owner, key = owned
    embedded = ckpt.new_job(engine, owner_id=owner, backend="embedded", base_model="embedded/char-gpt-0.2m")
    folder = ckpt.checkpoint_dir(settings, embedded, 0).parent
    folder.mkdir(parents=True)
    (folder / "0000.pt").write_bytes(b"not a real checkpoint")
    other = ckpt.new_job(engine, owner_id=owner)
    ckpt.checkpoint_dir(settings, other, 1).mkdir(parents=True)  # a directory without adapter_config.json
    api = client(live_server, key)
    with pytest.raises(openai.ConflictError, match="embedded backend"):
        api.chat.completions.create(model=embedded, messages=MESSAGES, max_tokens=1)
    with pytest.raises(openai.ConflictError, match="not a PEFT adapter"):
        api.chat.completions.create(model=other, messages=MESSAGES, max_tokens=1)


def test_requests_past_their_bounds_are_bad_requests_in_openais_envelope(live_server, engine, settings, owned, adapter):
    owner, key = owned
    job_id = trained_job(engine, settings, owner, adapter)
    api = client(live_server, key)
    too_many_tools = [{"type": "function", "function": {"name": f"f{i}", "parameters": {}}} for i in range(33)]
    for extra in ({"n": 9}, {"max_tokens": 513}, {"max_completion_tokens": 513}, {"temperature": 2.5}, {"top_p": 0},
                  {"stop": ["a", "b", "c", "d", "e"]}, {"tools": too_many_tools}, {"stream": True},
                  {"messages": []}, {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
                  {"messages": [{"role": "user", "content": "hello " * 2500}]}):  # fmt: skip
        arguments = {"model": job_id, "messages": MESSAGES, "max_tokens": 2} | extra
        with pytest.raises(openai.BadRequestError) as refused:
            api.chat.completions.create(**arguments)
        body = refused.value.body
        assert body["message"].startswith(("invalid request:", "invalid messages:", "the prompt is")), (extra, body)

    raw = httpx.post(f"{live_server}/v1/chat/completions", content=b"{not json",
                     headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})  # fmt: skip
    assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"


def test_past_the_waiting_requests_the_queue_answers_503_with_retry_after(
    app, live_server, engine, settings, owned, adapter
):
    owner, key = owned
    job_id = trained_job(engine, settings, owner, adapter)
    app.state.inference.max_waiting = 0  # one request at a time, none waiting
    api = client(live_server, key)
    api.chat.completions.create(model=job_id, messages=MESSAGES, max_tokens=1)  # loaded: the next one only samples
    slow = threading.Thread(target=api.chat.completions.create,
                            kwargs={"model": job_id, "messages": MESSAGES, "max_tokens": 512})  # fmt: skip
    slow.start()
    deadline = time.monotonic() + 10
    while app.state.inference._in_flight == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    response = httpx.post(f"{live_server}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                          json={"model": job_id, "messages": MESSAGES, "max_tokens": 1})  # fmt: skip
    slow.join()
    assert response.status_code == 503 and response.headers["retry-after"] == "5"
    assert response.json()["error"]["code"] == "overloaded"
    assert api.chat.completions.create(model=job_id, messages=MESSAGES, max_tokens=1).model == f"{job_id}@2"


def load_tokenizer(adapter: ckpt.Adapter):
    from service.backends.transformers.models import load_tokenizer

    tokenizer = load_tokenizer(adapter.folder)
    chat.add_tool_support(tokenizer)
    return tokenizer
