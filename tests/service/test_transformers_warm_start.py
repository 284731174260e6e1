"""The transformers backend's warm start on demonstrations that call tools (the email agent's teacher): ART's
tokeniser refuses a reply message with calls, so each becomes the tokens a policy writes for it, and the rows train
on the prompts the policy will be sampled from."""

from __future__ import annotations

import pytest
import torch

from environments.email.env import EmailEnvironment
from service.backends.transformers import chat, training


@pytest.fixture(scope="module")
def engine(tiny_lm, tmp_path_factory):
    from service.backends.transformers.engine import LoraSettings, PolicyEngine

    return PolicyEngine(tmp_path_factory.mktemp("warm") / "model", tiny_lm, lora=LoraSettings(rank=8))


def _demos(count: int) -> list:
    return list(EmailEnvironment().demonstrations(seed=0, count=count))


def _as_the_server_sees_it(tokenizer, message: dict, tools) -> dict:
    """An assistant message as the server returns it once a policy has written it: its text parsed back into calls."""
    text = tokenizer.decode(chat.reply_token_ids(tokenizer, message, tools), skip_special_tokens=True)
    parsed = chat.parse_tool_calls(text, call_id_prefix="c")
    return {"role": "assistant", "content": parsed.content, "tool_calls": parsed.tool_calls}


def test_a_demonstrations_calls_train_as_a_policy_writes_them_on_the_prompts_it_will_see(engine):
    tokenizer = engine.tokenizer
    [demo] = _demos(1)
    [row] = training.sft_rows(tokenizer, [demo])
    replies = [m for m in demo.messages_and_choices if isinstance(m, dict) and m.get("role") == "assistant"]
    assert len(replies) >= 2 and all(m["tool_calls"] for m in replies)

    written = [chat.reply_token_ids(tokenizer, m, demo.tools) for m in replies]
    assert [t for t, m in zip(row.token_ids, row.assistant_mask) if m] == [t for w in written for t in w]
    text = tokenizer.decode(row.token_ids).split("<|im_start|>user", 1)[1]
    assert text.count("<tool_call>") == len(replies)
    assert text.count("<|im_start|>assistant\n<tool_call>\n{\"name\": ") == len(replies)  # as the policy writes one
    for k, reply in enumerate(replies):  # each reply trains on the prompt the server renders for its turn
        before = demo.messages_and_choices[: demo.messages_and_choices.index(reply)]
        seen = [_as_the_server_sees_it(tokenizer, m, demo.tools) if m.get("role") == "assistant" else m for m in before]
        prompt = chat.render_prompt(tokenizer, seen, chat.tools_as_trained(demo.tools))
        assert row.token_ids[: len(prompt)] == prompt, k
        assert row.token_ids[len(prompt) : len(prompt) + len(written[k])] == written[k]


def _demos_nll(engine, rows) -> float:
    """Mean negative log-likelihood of the rows' assistant tokens under the engine's policy."""
    total, count = 0.0, 0
    with torch.no_grad():
        for row in rows:
            tokens = torch.tensor([row.token_ids])
            causal = torch.tril(torch.ones(len(row.token_ids), len(row.token_ids), dtype=torch.bool)).unsqueeze(0)
            logprobs, _ = training.token_logprobs(engine.model, tokens, causal, torch.arange(len(row.token_ids))[None])
            target = torch.tensor(row.assistant_mask[1:] + [0], dtype=torch.bool)
            total, count = total - float(logprobs[0][target].sum()), count + int(target.sum())
    return total / count


def test_the_warm_start_makes_the_teachers_tool_calls_likelier(engine):
    demos = _demos(2)
    rows = training.sft_rows(engine.tokenizer, demos)
    curve = [_demos_nll(engine, rows)]
    for _ in range(3):
        engine.sft_step(demos, learning_rate=3e-3)
        curve.append(_demos_nll(engine, rows))
    # the random tiny model starts near ln(49,152) = 10.8 nats a token; each step lowers it (0.1 the first)
    assert all(later < earlier for earlier, later in zip(curve, curve[1:])) and curve[-1] < curve[0] - 0.15, curve
