"""The transformers backend on a tiny random Llama with SmolLM2's real tokenizer and chat template: its OpenAI
server over real HTTP (the official client), ART's tokenisation of what it sampled, a GRPO step through ART's loss,
tool calls, checkpoints and resume."""

from __future__ import annotations

import asyncio
import gc
import json
import weakref

import art
import httpx
import openai
import pytest
import pytest_asyncio
import torch
from art.preprocessing.tokenize import tokenize_trajectory_groups

from environments.tools import INVALID_JSON, Tool, ToolArguments, ToolBox
from service.backends import batching, layout
from service.backends.transformers.backend import TransformersBackend, balanced_rows
from service.backends.transformers import attention, chat, training
from service.backends.transformers.engine import LoraSettings
from service.backends.transformers.generation import SamplingRequest
from service.training.diagnostics import typed_diagnostics

MESSAGES = [{"role": "system", "content": "Reply with `Final: <int>`."}, {"role": "user", "content": "What is 2 + 3?"}]


@pytest_asyncio.fixture
async def trained(tiny_lm, tmp_path):
    """A registered model on a fresh backend, its server started; closed after the test."""
    backend = TransformersBackend(path=tmp_path / "models", cache_dir=tmp_path / "cache", lora=LoraSettings(rank=8))
    model = art.TrainableModel(name="tiny", project=layout.PROJECT, base_model=str(tiny_lm), base_path=str(tmp_path / "art"))
    await model.register(backend)
    yield backend, model
    await backend.close()


async def _sample(model: art.TrainableModel, n: int, **extra) -> list:
    client = model.openai_client()
    response = await client.chat.completions.create(
        model=model.get_inference_name(), messages=MESSAGES, n=n, max_tokens=12, temperature=1.0, logprobs=True, seed=1, **extra
    )
    return list(response.choices)


@pytest.mark.asyncio
async def test_logprobs_name_token_ids_that_arts_tokenizer_reads_back_exactly(trained):
    backend, model = trained
    choices = await _sample(model, 4)
    engine = backend._engine(model.name)
    prompt = chat.render_prompt(engine.tokenizer, MESSAGES, None)
    group = art.TrajectoryGroup(
        [art.Trajectory(messages_and_choices=[*MESSAGES, c], reward=float(i)) for i, c in enumerate(choices)]
    )
    results = list(tokenize_trajectory_groups(engine.tokenizer, [group], False, True, shuffle_group_trajectories=False))
    assert len(results) == 4
    for choice, result in zip(choices, results):
        sampled = [int(entry.token.removeprefix("token_id:")) for entry in choice.logprobs.content]
        assert all(entry.token.startswith("token_id:") for entry in choice.logprobs.content)
        trained_ids = [t for t, m in zip(result.token_ids, result.assistant_mask) if m]
        assert result.token_ids[: len(prompt)] == prompt  # the prompt the server sampled from, token for token
        assert trained_ids == sampled  # ... and the reply's tokens, the end-of-turn token included when sampled
        assert [lp for lp, m in zip(result.logprobs, result.assistant_mask) if m] == pytest.approx(
            [e.logprob for e in choice.logprobs.content]
        )


@pytest.mark.asyncio
async def test_a_seeded_request_is_reproducible_and_models_are_addressed_by_step(trained):
    backend, model = trained
    first = await _sample(model, 2)
    again = await _sample(model, 2)
    assert [c.message.content for c in first] == [c.message.content for c in again]
    client = model.openai_client()
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model=f"{model.name}@7", messages=MESSAGES, max_tokens=2)
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="nobody", messages=MESSAGES, max_tokens=2)
    step0 = await client.chat.completions.create(model=f"{model.name}@0", messages=MESSAGES, max_tokens=2)
    assert step0.model == f"{model.name}@0"


@pytest.mark.asyncio
async def test_requests_that_arrive_together_are_decoded_in_even_batches(trained, monkeypatch):
    """A validation's 200 short rows go in two batches of 100, not 128 and a 72-row tail."""
    backend, model = trained
    # windows wide enough that a loaded machine's slower arrivals still form one pending set
    monkeypatch.setattr(batching, "BATCH_WINDOW_S", 0.5)
    monkeypatch.setattr(batching, "MAX_BATCH_WAIT_S", 30.0)
    engine = backend._engine(model.name)
    sizes, generate = [], engine.generate

    def recorded(requests, step=None):
        sizes.append(sum(r.n for r in requests))
        return generate(requests, step)

    monkeypatch.setattr(engine, "generate", recorded)
    client = model.openai_client()
    await asyncio.gather(*(client.chat.completions.create(model=model.name, messages=MESSAGES, max_tokens=1, seed=i)
                           for i in range(200)))  # fmt: skip
    assert sizes == [100, 100]


def test_a_batch_holds_its_rows_kv_cache_within_a_token_budget_split_evenly():
    short, long = SamplingRequest(prompt_ids=(1,) * 150, max_tokens=24), SamplingRequest(prompt_ids=(1,) * 2000)
    assert balanced_rows([short] * 64) == 64
    assert balanced_rows([short] * 129) == 65  # 65 and 64, not 128 and 1
    assert balanced_rows([SamplingRequest(prompt_ids=(1,), n=8)] * 25) == 100  # a request's n samples are its rows
    assert balanced_rows([long] * 100) == 34  # 48 rows of 2,016 tokens fit MAX_BATCH_TOKENS: three batches
    assert balanced_rows([long] * 40 + [short] * 40) == 40  # the longest row sizes the batch
    assert balanced_rows([SamplingRequest(prompt_ids=(1,) * 200_000)]) == 1  # a row past the budget still decodes


def _reply_logprob(engine, reply_ids: list[int]) -> float:
    from service.backends.transformers.training import token_logprobs

    prompt = chat.render_prompt(engine.tokenizer, MESSAGES, None)
    tokens = torch.tensor([prompt + reply_ids])
    length = tokens.shape[1]
    causal = torch.tril(torch.ones(length, length, dtype=torch.bool)).unsqueeze(0)
    with torch.no_grad():
        logprobs, _ = token_logprobs(engine.model, tokens, causal, torch.arange(length).unsqueeze(0))
    return float(logprobs[0, len(prompt) - 1 : length - 1].sum())


@pytest.mark.asyncio
async def test_a_grpo_step_makes_the_rewarded_reply_likelier_and_the_punished_one_less_likely(trained):
    backend, model = trained
    engine = backend._engine(model.name)
    assert engine.model.get_base_model().config._attn_implementation == attention.NAME  # the CPU's GQA without copies
    choices = await _sample(model, 8)
    ids = [[int(e.token.removeprefix("token_id:")) for e in c.logprobs.content] for c in choices]
    before = [_reply_logprob(engine, r) for r in ids[:2]]
    rewards = [1.0, 0.0] + [0.5] * 6  # the first rewarded, the second punished, the rest in between
    group = art.TrajectoryGroup(
        [art.Trajectory(messages_and_choices=[*MESSAGES, c], reward=r) for c, r in zip(choices, rewards)]
    )
    result = await backend.train(model, [group], learning_rate=5e-3)
    after = [_reply_logprob(engine, r) for r in ids[:2]]
    assert after[0] > before[0] and after[1] < before[1]
    assert result.step == 1 and result.metrics["trainable_groups"] == 1.0
    assert {"loss", "entropy", "kl_policy_ref", "grad_norm"} <= set(result.metrics)
    assert result.metrics["kl_policy_ref"] == 0.0  # measured before the update: the new adapter is zero
    second = await backend.train(model, [group], learning_rate=5e-3)
    assert second.metrics["kl_policy_ref"] > 0  # the adapter has moved away from the base model
    typed = typed_diagnostics(second.metrics)  # what the step's row gets: its KL column feeds the KL-spike alert
    assert typed["kl"] == second.metrics["kl_policy_ref"] and None not in (typed["loss"], typed["entropy"], typed["grad_norm"])
    flat = art.TrajectoryGroup([art.Trajectory(messages_and_choices=[*MESSAGES, c], reward=1.0) for c in choices[:2]])
    skipped = await backend.train(model, [flat], learning_rate=5e-3)
    assert skipped.metrics["zero_variance_groups"] == 1.0 and skipped.metrics["trained_trajectories"] == 0.0


@pytest.mark.asyncio
async def test_resume_continues_from_the_newest_checkpoint_with_its_weights(trained, tiny_lm, tmp_path):
    backend, model = trained
    engine = backend._engine(model.name)
    choices = await _sample(model, 4)
    group = art.TrajectoryGroup(
        [art.Trajectory(messages_and_choices=[*MESSAGES, c], reward=float(i)) for i, c in enumerate(choices)]
    )
    for _ in range(3):
        await backend.train(model, [group], learning_rate=1e-3)
    reply = [int(e.token.removeprefix("token_id:")) for e in choices[0].logprobs.content]
    trained_logprob = _reply_logprob(engine, reply)
    await backend._delete_checkpoint_files(model, [0, 2, 3])
    assert engine.steps() == [0, 2, 3]
    again = TransformersBackend(path=tmp_path / "models", cache_dir=tmp_path / "cache", lora=LoraSettings(rank=8))
    try:
        await model.register(again)
        resumed = again._engine(model.name)
        assert await model.get_step() == 3
        assert _reply_logprob(resumed, reply) == pytest.approx(trained_logprob, abs=1e-5)
        assert resumed.optimizer.state  # Adam's moments came back too
        await again._delete_checkpoint_files(model, [0, 2])  # a resume that rolls back a step
        assert resumed.step == 2 and resumed.steps() == [0, 2]
    finally:
        await again.close()


class _Lookup(ToolArguments):
    word: str


def test_hermes_tool_calls_become_openai_tool_calls_and_broken_ones_tool_errors():
    text = 'Let me look.\n<tool_call>\n{"name": "lookup", "arguments": {"word": "cat"}}\n</tool_call>'
    reply = chat.parse_tool_calls(text, call_id_prefix="call_x")
    assert reply.content == "Let me look."
    assert reply.tool_calls == [
        {"id": "call_x_0", "type": "function", "function": {"name": "lookup", "arguments": json.dumps({"word": "cat"})}}
    ]
    broken = chat.parse_tool_calls('<tool_call>{"name": "lookup", "arguments": {"word": </tool_call>', call_id_prefix="c")
    assert broken.content is None and broken.tool_calls[0]["function"]["name"] == "lookup"
    box = ToolBox([Tool("lookup", "Look a word up.", _Lookup, lambda word: f"{word}: found")])
    answer = box.call(broken.tool_calls[0]["function"]["name"], broken.tool_calls[0]["function"]["arguments"])
    assert answer.error == INVALID_JSON and answer.content.startswith("error:")
    assert chat.parse_tool_calls("<tool_call>{unterminated", call_id_prefix="c").tool_calls == []


@pytest.mark.asyncio
async def test_tools_are_rendered_by_the_template_and_calls_come_back_as_tool_calls(trained, monkeypatch):
    backend, model = trained
    engine = backend._engine(model.name)
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.",
                                               "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}]  # fmt: skip
    prompt = engine.tokenizer.decode(chat.render_prompt(engine.tokenizer, MESSAGES, tools))
    assert "<tools>" in prompt and '"name": "lookup"' in prompt and prompt.endswith("<|im_start|>assistant\n")
    assert "<tools>" not in engine.tokenizer.decode(chat.render_prompt(engine.tokenizer, MESSAGES, None))
    call = '<tool_call>\n{"name": "lookup", "arguments": {"word": "cat"}}\n</tool_call>'
    forced = _script_replies(monkeypatch, engine, [call])[0][0]
    response = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(), messages=MESSAGES, tools=tools, max_tokens=40, logprobs=True
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls[0].function.name == "lookup"
    assert json.loads(choice.message.tool_calls[0].function.arguments) == {"word": "cat"}
    history = [*MESSAGES, choice, {"role": "tool", "tool_call_id": choice.message.tool_calls[0].id, "content": "cat: found"}]
    group = art.TrajectoryGroup(
        [art.Trajectory(messages_and_choices=history, tools=tools, reward=r) for r in (0.0, 1.0)]
    )
    results = list(tokenize_trajectory_groups(engine.tokenizer, [group], False, True, shuffle_group_trajectories=False))
    assert [t for t, m in zip(results[0].token_ids, results[0].assistant_mask) if m] == forced


def _script_replies(monkeypatch, engine, replies: list[str]) -> tuple[list[list[int]], list[list[int]]]:
    """The engine's sampler replaced by one that writes ``replies`` in turn (the random model cannot write a call),
    so they go through the real server. Returns each reply's token ids (its end-of-turn token included) and a list
    that gathers the prompt each was sampled from."""
    from service.backends.openai_server import Sample

    end = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
    ids = [engine.tokenizer.encode(reply, add_special_tokens=False) + [end] for reply in replies]
    turns, prompts = iter(zip(replies, ids)), []

    def scripted(requests, step=None):
        text, tokens = next(turns)
        prompts.extend(list(request.prompt_ids) for request in requests)
        sample = Sample(text=text, token_ids=tokens, logprobs=[-1.0] * len(tokens), finish_reason="stop")
        return [[sample] for _ in requests]

    monkeypatch.setattr(engine, "generate", scripted)
    return ids, prompts


@pytest.mark.asyncio
async def test_an_episodes_sampled_calls_stand_once_in_its_training_row_as_the_policy_wrote_them(trained, monkeypatch):
    backend, model = trained
    engine = backend._engine(model.name)
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    calls = ['<tool_call>\n{"name": "lookup", "arguments": {"word": "cat"}}\n</tool_call>',
             '<tool_call>\n{"name": "lookup", "arguments": {"word": "dog"}}\n</tool_call>']  # fmt: skip
    sampled, prompts = _script_replies(monkeypatch, engine, calls)
    history, messages = [*MESSAGES], [*MESSAGES]  # the trajectory's and what the client sends
    for _ in calls:
        response = await model.openai_client().chat.completions.create(
            model=model.get_inference_name(), messages=messages, tools=tools, max_tokens=40, logprobs=True
        )
        choice = response.choices[0]
        answer = {"role": "tool", "tool_call_id": choice.message.tool_calls[0].id, "content": "found"}
        history += [choice, answer]
        messages += [choice.message.model_dump(exclude_none=True), answer]
    episodes = [art.Trajectory(messages_and_choices=history[:-1], tools=tools, reward=r) for r in (0.0, 1.0)]
    group = art.TrajectoryGroup(episodes)

    row = training.tokenize_groups(engine.tokenizer, [group], scale_rewards=True)[0]
    text = engine.tokenizer.decode(row.token_ids).split("<|im_start|>user", 1)[1]  # the conversation, after the tools
    assert text.count("<tool_call>") == 2 and text.count('"cat"') == 1  # ART alone renders the first call twice
    assert [t for t, m in zip(row.token_ids, row.assistant_mask) if m] == sampled[0] + sampled[1]
    assert row.token_ids[: len(prompts[1])] == prompts[1]  # the second turn trains on the prompt it was sampled from
    assert history[2].message.tool_calls  # the episode's own messages keep their calls


def test_a_stoppable_prompt_is_encoded_in_chunks_as_one_pass_would_and_a_stop_ends_it_between_chunks(tiny_lm):
    from transformers import AutoModelForCausalLM

    from service.backends.transformers.generation import PREFILL_CHUNK, Generator, SamplingRequest
    from service.backends.transformers.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_lm)
    model = AutoModelForCausalLM.from_pretrained(str(tiny_lm)).eval()
    # no prefix cache: each call encodes the prompt from its first token
    generator = Generator(model, tokenizer, end_token_ids=chat.end_token_ids(tokenizer), prefix_cache_bytes=0)
    request = SamplingRequest(prompt_ids=tuple(range(100, 100 + 2 * PREFILL_CHUNK + 7)), temperature=0, max_tokens=3)
    [[whole]] = generator.generate([request])
    [[chunked]] = generator.generate([request], should_stop=lambda: False)
    assert chunked.token_ids == whole.token_ids
    assert max(abs(a - b) for a, b in zip(chunked.logprobs, whole.logprobs)) < 1e-4

    asked: list[int] = []
    [[stopped]] = generator.generate([request], should_stop=lambda: asked.append(1) or len(asked) > 1)
    assert stopped.token_ids == [] and stopped.finish_reason == "length" and len(asked) == 2  # before the second chunk


def test_a_template_that_rewrites_the_callers_text_renders_as_usual_but_refuses_control_tokens_in_it(tiny_lm):
    from service.backends.transformers.literal_prompt import ControlTokenInText, render_literal_prompt
    from service.backends.transformers.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_lm)
    tokenizer.chat_template = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content | trim }}<|im_end|>\n{% endfor %}"
    padded = [{"role": "user", "content": "  hi  "}]
    assert render_literal_prompt(tokenizer, padded, None) == chat.render_prompt(tokenizer, padded, None)
    with pytest.raises(ControlTokenInText):
        render_literal_prompt(tokenizer, [{"role": "user", "content": " hi<|im_start|>system "}], None)


def test_arts_loss_with_the_head_where_it_reads_equals_the_full_head_with_the_same_gradients(tiny_lm):
    """An RL row's head runs at the positions ART's loss reads (``read_positions``): loss, entropy, probs_corr and every
    gradient are those of the head at every position, in float32 to 1e-5."""
    from art import dev
    from art.loss import loss_fn
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(tiny_lm), dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    n = 96
    tokens = torch.randint(0, model.config.vocab_size, (1, n), generator=generator)
    replies = torch.zeros(1, n, dtype=torch.bool)
    replies[0, 40:52] = replies[0, 70:90] = True  # two replies after an opening, as in an agent's row
    sampled = torch.where(replies, -torch.rand(1, n, generator=generator), torch.full((1, n), float("nan")))
    sampled[0, 45] = float("nan")  # a trained token without a sampled logprob still trains
    inputs = {"tokens": tokens, "assistant_mask": replies, "logprobs": sampled, "weights": torch.ones(1, n),
              "advantages": torch.where(replies, torch.randn(1, n, generator=generator), torch.zeros(1, n)),
              "group_ids": torch.ones(1, n, dtype=torch.long)}  # fmt: skip
    causal = torch.tril(torch.ones(n, n, dtype=torch.bool)).unsqueeze(0)
    positions = torch.arange(n).unsqueeze(0)
    read = training.read_positions(inputs)
    assert int(read.sum()) == 34 and read[0, 39] and read[0, 51] and not read[0, 38] and not read[0, 52]  # and 69-89

    def loss_and_gradients(at):
        model.zero_grad()
        new, entropies = training.token_logprobs(model, tokens, causal, positions, entropy=True, at=at)
        loss = loss_fn(inputs, new, None, entropies, dev.TrainConfig())  # type: ignore[arg-type]
        loss.policy_loss.backward()
        grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
        return [loss.policy_loss.item(), loss.entropy.item(), loss.probs_corr.item()], grads

    full, full_grads = loss_and_gradients(None)
    only, only_grads = loss_and_gradients(read)
    assert only == pytest.approx(full, abs=1e-5) and len(only_grads) == len(full_grads) > 0
    for a, b in zip(only_grads, full_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


@pytest.mark.asyncio
async def test_a_request_is_answered_on_the_event_loop_without_a_worker_thread(trained, monkeypatch):
    """The server's own work per request (its key check, the response) never waits on anyio's thread pool: a rollout
    batch's 64 concurrent requests once made it start up to 40 threads that hand every request back and forth. A
    key with a non-ASCII byte is refused like any wrong key (it was a 500)."""
    import anyio.to_thread

    _, model = trained
    hops, run_sync = [], anyio.to_thread.run_sync

    async def counted(func, *args, **kwargs):
        hops.append(getattr(func, "__name__", repr(func)))
        return await run_sync(func, *args, **kwargs)

    monkeypatch.setattr(anyio.to_thread, "run_sync", counted)
    client = model.openai_client()
    await asyncio.gather(*(client.chat.completions.create(model=model.name, messages=MESSAGES, max_tokens=1, seed=i)
                           for i in range(8)))  # fmt: skip
    with pytest.raises(openai.AuthenticationError):
        await openai.AsyncOpenAI(base_url=str(client.base_url), api_key="wrong").chat.completions.create(
            model=model.name, messages=MESSAGES, max_tokens=1
        )
    assert hops == []
    async with httpx.AsyncClient() as http:
        refused = await http.post(f"{client.base_url}chat/completions", headers={"Authorization": b"Bearer \xe9"},
                                  json={"model": model.name, "messages": MESSAGES})  # fmt: skip
    assert refused.status_code == 401  # a header's non-ASCII character is a wrong key, not a server error


@pytest.mark.asyncio
async def test_a_closed_backend_lets_its_model_go_though_its_servers_endpoints_live_on(tiny_lm, tmp_path):
    """A worker trains job after job in one process, each on a backend of its own; FastAPI keeps a server's endpoints
    (which reach the backend) in process-wide caches after the server stopped. Before, every finished job's model
    stayed loaded: 0.54 GiB more resident a job for SmolLM2 (README Results)."""
    engines = []
    for name in ("first", "second"):
        backend = TransformersBackend(path=tmp_path / "models", cache_dir=tmp_path / "cache", lora=LoraSettings(rank=8))
        model = art.TrainableModel(name=name, project=layout.PROJECT, base_model=str(tiny_lm),
                                   base_path=str(tmp_path / "art"))  # fmt: skip
        await model.register(backend)
        await _sample(model, 1)  # the server answered: its endpoints are in FastAPI's caches
        engines.append(weakref.ref(backend._engine(model.name)))
        await backend.close()
        del backend, model
    gc.collect()
    assert [engine() for engine in engines] == [None, None]
