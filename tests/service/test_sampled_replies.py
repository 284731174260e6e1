"""An episode's next prompt holds its earlier replies as the sampler drew them, so the trainer (ART's tokenisation,
which keeps every turn's drawn tokens) scores each turn in the context it was sampled in. On the tiny random Llama
under the email grammar, whose replies often split otherwise than their text reads back."""

from __future__ import annotations

import json

import art
import pytest
from openai.types.chat.chat_completion import Choice

from environments.email.env import EmailEnvironment, opening
from service.backends.openai_server import ChatCompletionRequest, completion
from service.backends.transformers import chat, training
from service.backends.transformers.engine import LoraSettings, PolicyEngine
from service.backends.transformers.sampled_replies import SampledReplies
from service.backends.transformers.template_chat import TemplateChat

ENV = EmailEnvironment()


@pytest.fixture(scope="module")
def engine(tiny_lm, tmp_path_factory) -> PolicyEngine:
    return PolicyEngine(tmp_path_factory.mktemp("replies") / "model", tiny_lm, lora=LoraSettings(rank=8))


def _turn(engine: PolicyEngine, fmt: TemplateChat, messages: list[dict], *, n: int, seed: int):
    """One sampled turn through the policy server's own path: its sampling request and its choices."""
    request = ChatCompletionRequest(model="m", messages=messages, tools=list(ENV.tools), tool_choice="required",
                                    parallel_tool_calls=False, n=n, seed=seed, logprobs=True)  # fmt: skip
    sampling = fmt.sampling_request(request, max_tokens=128, stop=())
    [samples] = engine.generate([sampling])
    body = completion(request, fmt, model="m", samples=samples, prompt_tokens=len(sampling.prompt_ids))
    return sampling, samples, [Choice.model_validate(choice) for choice in body["choices"]]


def _answered(messages: list[dict], choice: Choice) -> list[dict]:
    [call] = choice.message.tool_calls
    return [*messages, choice, {"role": "tool", "tool_call_id": call.id, "content": "no results"}]


def _as_sent(items: list) -> list[dict]:
    return art.Trajectory(messages_and_choices=items, reward=0.0).messages()


def _reads_back(engine: PolicyEngine, sample, choice: Choice) -> bool:
    """Whether the reply's calls, rendered, are its text: not so where the model wrote an escape (``\\u00e9``, ``\\/``)
    that parsing and writing the arguments back normalise; such a reply is not found again and stays as rendered."""
    message = _as_sent([choice])[0]
    return engine.tokenizer.decode(chat.reply_token_ids(engine.tokenizer, message, list(ENV.tools))[:-1]) == sample.text


def test_the_next_prompt_extends_the_last_prompt_by_the_tokens_drawn(engine):
    fmt = TemplateChat(lambda _: engine.tokenizer, replies_for=lambda _: engine.replies)
    rendered = TemplateChat(lambda _: engine.tokenizer)  # as before: the conversation's text tokenized again
    first = opening(ENV.scenarios("val")[0])
    sampling, samples, choices = _turn(engine, fmt, first, n=8, seed=5)
    split_otherwise = checked = 0
    for sample, choice in zip(samples, choices):
        if not _reads_back(engine, sample, choice):
            continue
        drawn = [*sampling.prompt_ids, *sample.token_ids[:-1]]  # the template writes the end-of-turn token
        request = ChatCompletionRequest(model="m", messages=_as_sent(_answered(first, choice)), tools=list(ENV.tools))
        assert list(fmt.sampling_request(request, max_tokens=8, stop=()).prompt_ids[: len(drawn)]) == drawn
        split_otherwise += rendered.sampling_request(request, max_tokens=8, stop=()).prompt_ids[: len(drawn)] != drawn
        checked += 1
    assert checked >= 4, checked
    assert split_otherwise > 0  # the random model's replies read back otherwise: what this test guards against


def test_art_trains_each_turn_on_the_tokens_the_sampler_saw(engine):
    """Two turns of two episodes; ART's tokenisation of each episode is the second turn's prompt and its reply."""
    fmt = TemplateChat(lambda _: engine.tokenizer, replies_for=lambda _: engine.replies)
    first = opening(ENV.scenarios("val")[1])
    _, samples, choices = _turn(engine, fmt, first, n=8, seed=7)
    choices = [choice for sample, choice in zip(samples, choices) if _reads_back(engine, sample, choice)][:2]
    assert len(choices) == 2
    episodes, seen = [], []
    for number, choice in enumerate(choices):
        items = _answered(first, choice)
        sampling, samples, [reply] = _turn(engine, fmt, _as_sent(items), n=1, seed=number)
        episodes.append(art.Trajectory(messages_and_choices=[*items, reply], tools=list(ENV.tools), reward=number))
        seen.append(list(sampling.prompt_ids))  # the second turn's context, the first reply in it as drawn
    results = training.tokenize_groups(engine.tokenizer, [art.TrajectoryGroup(episodes)], scale_rewards=True)
    results.sort(key=lambda result: result.advantage)  # ART shuffles a group's episodes; rewards 0 and 1 order them
    assert [result.token_ids[: len(prompt)] for result, prompt in zip(results, seen)] == seen


def test_a_reply_drawn_in_another_context_is_not_spliced(engine):
    replies = SampledReplies()
    replies.remember([1, 2, 3], "x", [7, 8, 9])
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]
    prompt = chat.render_prompt(engine.tokenizer, messages, None)
    assert replies.splice(engine.tokenizer, prompt, messages, None) == prompt


def test_characters_json_would_escape_read_back_as_the_model_wrote_them(engine):
    text = '<tool_call>\n{"name": "search_inbox", "arguments": {"keywords": "café 接 ῗ"}}\n</tool_call>'
    [call] = chat.parse_tool_calls(text, call_id_prefix="c").tool_calls
    assert call["function"]["arguments"] == '{"keywords": "café 接 ῗ"}'
    message = {"role": "assistant", "content": None, "tool_calls": [call]}
    assert engine.tokenizer.decode(chat.reply_token_ids(engine.tokenizer, message, list(ENV.tools))[:-1]) == text


def test_a_lone_surrogate_stays_escaped_so_that_the_reply_can_be_sent():
    text = '<tool_call>\n{"name": "search_inbox", "arguments": {"keywords": "\\ud800 café"}}\n</tool_call>'
    [call] = chat.parse_tool_calls(text, call_id_prefix="c").tool_calls
    arguments = call["function"]["arguments"]
    assert arguments.encode("utf-8") and json.loads(arguments) == {"keywords": "\ud800 café"}



def test_arguments_nested_past_the_parsers_depth_stay_as_text_for_the_tool_to_refuse(engine):
    nested = "[" * 100_000 + "]" * 100_000
    text = f'<tool_call>\n{{"name": "search_inbox", "arguments": {nested}}}\n</tool_call>'
    [call] = chat.parse_tool_calls(text, call_id_prefix="c").tool_calls
    assert call["function"]["name"] == "search_inbox" and nested in call["function"]["arguments"]
    sent = {"id": "c_0", "type": "function", "function": {"name": "search_inbox", "arguments": nested}}
    message = {"role": "assistant", "content": None, "tool_calls": [sent]}
    assert nested in engine.tokenizer.decode(chat.reply_token_ids(engine.tokenizer, message, list(ENV.tools)))


def test_splicing_a_prompt_does_not_rebuild_the_vocabulary_for_each_reply(engine, monkeypatch):
    """A tokenizer's end tokens are looked up once: ``get_vocab()`` builds the whole vocabulary at each call (9-22 ms
    for SmolLM2), and every request's earlier replies (math's worked examples, an agent's turns) are rendered through
    them; before, that was half of the main job's event loop, holding the GIL the model thread needs."""
    tokenizer, built = engine.tokenizer, []
    vocabulary = tokenizer.get_vocab
    monkeypatch.setattr(tokenizer, "get_vocab", lambda: built.append(1) or vocabulary())
    replies = SampledReplies()
    replies.remember([1, 2, 3], "x", [7, 8, 9])
    messages = [{"role": "user", "content": "2+2?"}]
    for answer in range(6):
        messages += [{"role": "assistant", "content": f"Final: {answer}"}, {"role": "user", "content": "again"}]
    prompt = chat.render_prompt(tokenizer, messages, None)
    assert replies.splice(tokenizer, prompt, messages, None) == prompt
    assert chat.end_token_ids(tokenizer) == engine.sampler.end_token_ids and built == []
