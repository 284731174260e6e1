"""The embedded backend through its real interfaces: ART's Backend protocol and OpenAI's HTTP API."""

from __future__ import annotations

import asyncio

import art
import httpx
import openai
import pytest
import torch
from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_message import ChatCompletionMessage
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob

from service.backends.embedded import EmbeddedBackend
from service.backends.embedded.objectives import token_logprobs
from service.backends.embedded.sequences import collate, trajectory_windows
from service.backends.embedded.tokenizer import decode, render_prompt

TINY = "embedded/char-gpt-0.2m"
PROMPT = [{"role": "user", "content": "What is 3 + 4?"}]


async def _registered(tmp_path, name="policy", seed=0):
    backend = EmbeddedBackend(path=tmp_path / "models", cache_dir=tmp_path / "cache", seed=seed)
    model = art.TrainableModel(name=name, project="tests", base_model=TINY, base_path=str(tmp_path / "art"))
    await model.register(backend)
    return backend, model


def completion_logprob(backend: EmbeddedBackend, model: art.TrainableModel, text: str) -> float:
    """Log-probability the live policy gives ``text`` (and ending its turn) after PROMPT."""
    policy = backend._engines[model.name].policy
    (seq,) = trajectory_windows(
        [*PROMPT, {"role": "assistant", "content": text}], block_size=policy.config.block_size, train_on_messages=True
    )
    batch = collate([seq], policy.config.block_size)
    with torch.no_grad():
        chosen, _ = token_logprobs(policy.eval(), batch)
    return float(chosen.sum())


def sampled_choice(backend, model, text: str) -> Choice:
    """A Choice as the server would return it for ``text``, with the policy's own logprobs."""
    policy = backend._engines[model.name].policy
    (seq,) = trajectory_windows(
        [*PROMPT, {"role": "assistant", "content": text}], block_size=policy.config.block_size, train_on_messages=True
    )
    with torch.no_grad():
        chosen, _ = token_logprobs(policy.eval(), collate([seq], policy.config.block_size))
    per_token = chosen[0][torch.tensor(seq.trainable[1:], dtype=torch.bool)].tolist()[: len(text)]
    entries = [ChatCompletionTokenLogprob(token=c, logprob=lp, bytes=list(c.encode()), top_logprobs=[]) for c, lp in zip(text, per_token)]
    return Choice(
        index=0,
        finish_reason="stop",
        message=ChatCompletionMessage(role="assistant", content=text),
        logprobs=ChoiceLogprobs(content=entries),
    )


@pytest.mark.asyncio
async def test_chat_completions_speak_openai_with_consistent_logprobs(tmp_path):
    backend, model = await _registered(tmp_path)
    try:
        client = model.openai_client()
        response = await client.chat.completions.create(
            model=model.get_inference_name(), messages=PROMPT, n=3, temperature=1.0,
            max_tokens=8, seed=7, logprobs=True, top_logprobs=3,
        )  # fmt: skip
        again = await client.chat.completions.create(
            model=model.get_inference_name(), messages=PROMPT, n=3, max_tokens=8, seed=7, logprobs=True
        )
        # the returned logprobs are the policy's own: recompute them with a full forward pass (a closed backend
        # has let its policy go)
        texts = [c.message.content for c in response.choices]
        recomputed = {text: completion_logprob(backend, model, text) for text in texts}
        own = {text: sampled_choice(backend, model, text) for text in texts}
    finally:
        await backend.close()

    assert response.model == f"{model.name}@0"
    assert len(response.choices) == 3
    assert [c.message.content for c in response.choices] == [c.message.content for c in again.choices]
    for choice in response.choices:
        text = choice.message.content
        entries = choice.logprobs.content
        assert "".join(e.token for e in entries) == text and len(text) <= 8
        assert choice.finish_reason == ("length" if len(text) == 8 else "stop")
        for entry in entries:
            assert entry.logprob <= 0.0
            tops = [t.logprob for t in entry.top_logprobs]
            assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] >= entry.logprob - 1e-6
        if choice.finish_reason == "stop":
            policy_eot = recomputed[text] - sum(e.logprob for e in entries)
            assert policy_eot <= 1e-4  # the remainder is log P(<eot>), a valid log-probability
        per_token = own[text].logprobs.content
        assert [round(e.logprob, 4) for e in entries] == [round(e.logprob, 4) for e in per_token]
    assert response.usage.completion_tokens >= sum(len(c.message.content) for c in response.choices)


@pytest.mark.asyncio
async def test_stop_strings_greedy_and_errors(tmp_path):
    async def scenario():
        backend, model = await _registered(tmp_path)
        client = model.openai_client()
        try:
            greedy = [
                (await client.chat.completions.create(model=model.name, messages=PROMPT, temperature=0, max_tokens=6, seed=s))
                .choices[0].message.content
                for s in (1, 2)
            ]  # fmt: skip
            text = greedy[0]
            stopped = None
            if len(text) >= 2:
                stopped = await client.chat.completions.create(
                    model=model.name, messages=PROMPT, temperature=0, max_tokens=6, stop=[text[1]]
                )
            with pytest.raises(openai.NotFoundError):
                await client.chat.completions.create(model="nobody", messages=PROMPT)
            with pytest.raises(openai.NotFoundError):
                await client.chat.completions.create(model=f"{model.name}@99", messages=PROMPT)
            with pytest.raises(openai.BadRequestError):
                await client.chat.completions.create(model=model.name, messages=PROMPT, n=0)
            intruder = openai.AsyncOpenAI(base_url=backend.base_url, api_key="wrong")
            with pytest.raises(openai.AuthenticationError):
                await intruder.chat.completions.create(model=model.name, messages=PROMPT)
            return greedy, stopped
        finally:
            await backend.close()

    greedy, stopped = await scenario()
    assert greedy[0] == greedy[1]  # greedy ignores the seed
    if stopped is not None:
        choice = stopped.choices[0]
        assert choice.message.content == greedy[0][: greedy[0].index(greedy[0][1])]
        assert choice.finish_reason == "stop" and choice.stop_reason == greedy[0][1]


@pytest.mark.asyncio
async def test_the_policy_server_closes_each_connection_after_its_response(tmp_path):
    """A rollout client keeps no idle connection to the policy server: httpx checks every idle one at each request
    (serving.ClosingEachConnection). Errors close too, and the next request opens a new connection and is answered."""
    backend, model = await _registered(tmp_path)
    try:
        async with httpx.AsyncClient(base_url=backend.base_url, timeout=60) as http:
            auth = {"Authorization": f"Bearer {model.inference_api_key}"}
            body = {"model": model.name, "messages": PROMPT, "max_tokens": 4}
            answers = await asyncio.gather(*[http.post("/chat/completions", json=body, headers=auth) for _ in range(8)])
            refused = await http.post("/chat/completions", json=body, headers={"Authorization": "Bearer wrong"})
            after = await http.post("/chat/completions", json=body, headers=auth)
    finally:
        await backend.close()
    assert [r.status_code for r in answers] == [200] * 8 and refused.status_code == 401 and after.status_code == 200
    assert all(r.headers["connection"] == "close" for r in [*answers, refused, after])
    assert all(r.json()["choices"] for r in [*answers, after])


@pytest.mark.asyncio
async def test_grpo_step_raises_rewarded_and_lowers_punished_completion(tmp_path):
    async def scenario():
        backend, model = await _registered(tmp_path)
        try:
            good, bad = "Final: 7", "final: 7"
            before = completion_logprob(backend, model, good), completion_logprob(backend, model, bad)
            group = art.TrajectoryGroup(
                art.Trajectory(messages_and_choices=[*PROMPT, sampled_choice(backend, model, text)], reward=reward)
                for text, reward in [(good, 1.0), (bad, 0.0), (good, 1.0), (bad, 0.0)]
            )
            result = await backend.train(model, [group], learning_rate=1e-3)
            after = completion_logprob(backend, model, good), completion_logprob(backend, model, bad)
            return result, before, after
        finally:
            await backend.close()

    result, (good_before, bad_before), (good_after, bad_after) = await scenario()
    assert result.step == 1
    assert good_after > good_before
    assert bad_after < bad_before
    assert result.metrics["trainable_groups"] == 1 and result.metrics["zero_variance_groups"] == 0
    assert {"loss", "entropy", "kl", "grad_norm", "clip_fraction"} <= set(result.metrics)
    assert result.metrics["clip_fraction"] == 0.0  # on-policy: every ratio starts at 1


@pytest.mark.asyncio
async def test_zero_variance_groups_are_skipped_and_counted(tmp_path):
    async def scenario():
        backend, model = await _registered(tmp_path)
        try:
            weights = {k: v.clone() for k, v in backend._engines[model.name].policy.state_dict().items()}
            flat = art.TrajectoryGroup(
                art.Trajectory(messages_and_choices=[*PROMPT, sampled_choice(backend, model, "Final: 7")], reward=1.0)
                for _ in range(4)
            )
            result = await backend.train(model, [flat, flat], learning_rate=1e-2)
            after = backend._engines[model.name].policy.state_dict()
            return result, weights, after, await model.get_step()
        finally:
            await backend.close()

    result, before, after, step = await scenario()
    assert result.metrics["zero_variance_groups"] == 2 and result.metrics["trainable_groups"] == 0
    assert all(torch.equal(before[k], after[k]) for k in before)  # no signal, no update
    assert step == 1  # the step still advances, as ART's backends do


@pytest.mark.asyncio
async def test_checkpoints_survive_a_restart_and_can_be_rolled_back(tmp_path):
    async def train_two_steps():
        backend, model = await _registered(tmp_path)
        try:
            for _ in range(2):
                group = art.TrajectoryGroup(
                    art.Trajectory(messages_and_choices=[*PROMPT, sampled_choice(backend, model, t)], reward=r)
                    for t, r in [("Final: 7", 1.0), ("Final: 8", 0.0)]
                )
                await backend.train(model, [group], learning_rate=1e-3)
            return completion_logprob(backend, model, "Final: 7")
        finally:
            await backend.close()

    async def reopen(rollback_to=None):
        backend, model = await _registered(tmp_path)
        try:
            if rollback_to is not None:
                await backend._delete_checkpoint_files(model, list(range(rollback_to + 1)))
            return await model.get_step(), completion_logprob(backend, model, "Final: 7")
        finally:
            await backend.close()

    trained = await train_two_steps()
    step, reopened = await reopen()
    assert step == 2 and reopened == pytest.approx(trained, abs=1e-6)
    step, rolled_back = await reopen(rollback_to=1)
    assert step == 1 and rolled_back != pytest.approx(trained, abs=1e-6)


@pytest.mark.asyncio
async def test_warm_start_learns_the_demonstrations_and_is_cached(tmp_path):
    demos = [art.Trajectory(messages_and_choices=[*PROMPT, {"role": "assistant", "content": "Final: 7"}])] * 256

    async def warm_start(root):
        backend, model = await _registered(root)
        try:
            before = completion_logprob(backend, model, "Final: 7")
            config = art.TrainSFTConfig(learning_rate=3e-3, batch_size=32)
            metrics = [m async for m in backend._train_sft(model, demos, config, {}, False)]
            return before, completion_logprob(backend, model, "Final: 7"), metrics
        finally:
            await backend.close()

    before, after, metrics = await warm_start(tmp_path / "first")
    assert len(metrics) == 8 and metrics[-1]["loss"] < metrics[0]["loss"]
    assert after > before + 10
    # the same run elsewhere, sharing the cache, loads the result instead of training
    second_root = tmp_path / "second"
    second_root.mkdir()
    (second_root / "cache").symlink_to(tmp_path / "first" / "cache")
    _, cached_after, cached_metrics = await warm_start(second_root)
    assert cached_metrics == [{"cache_hit": 1.0, "batches": 8.0}]
    assert cached_after == pytest.approx(after, abs=1e-6)


SEARCH_TOOL = {"type": "function", "function": {"name": "read_email", "parameters": {"type": "object"}}}


@pytest.mark.asyncio
async def test_a_policy_taught_to_call_a_tool_answers_with_openai_tool_calls(tmp_path):
    """Demonstrations with tool_calls render in the text convention; the server parses them back."""
    call = {"id": "c0", "type": "function", "function": {"name": "read_email", "arguments": '{"id": "a1"}'}}
    conversation = [*PROMPT, {"role": "assistant", "content": "", "tool_calls": [call]}]
    demos = [art.Trajectory(messages_and_choices=conversation)] * 512

    async def scenario():
        backend, model = await _registered(tmp_path)
        try:
            config = art.TrainSFTConfig(learning_rate=3e-3, batch_size=32)
            _ = [m async for m in backend._train_sft(model, demos, config, {}, False)]
            client = model.openai_client()
            ask = dict(model=model.get_inference_name(), messages=PROMPT, temperature=0, max_tokens=48, logprobs=True)
            with_tools = await client.chat.completions.create(**ask, tools=[SEARCH_TOOL])
            without_tools = await client.chat.completions.create(**ask)
            return with_tools.choices[0], without_tools.choices[0]
        finally:
            await backend.close()

    parsed, raw = await scenario()
    assert raw.message.content == '<tool_call>read_email {"id": "a1"}</tool_call>'
    assert parsed.finish_reason == "tool_calls" and parsed.message.content is None
    (tool_call,) = parsed.message.tool_calls
    assert (tool_call.function.name, tool_call.function.arguments) == ("read_email", '{"id": "a1"}')
    assert parsed.context_tokens == len(render_prompt(PROMPT))
    # what the trainer rebuilds from the sampled turn is the text the policy wrote, logprobs included
    (window,) = trajectory_windows([*PROMPT, parsed], block_size=192, train_on_messages=False)
    trained = [(t, lp) for t, lp, flag in zip(window.ids, window.old_logprobs, window.trainable) if flag]
    assert decode(t for t, _ in trained) == raw.message.content
    assert [lp for _, lp in trained[:-1]] == [e.logprob for e in parsed.logprobs.content]
