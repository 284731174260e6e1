"""Replies held to tool calls (``tool_choice``) on the tiny random Llama: under ``required`` every reply of a batch is
one or more Hermes calls of the request's tools whose arguments validate against the tools' schemas, under a named
function exactly one call of it, and each reply's text is the template's rendering of its calls; the email
teacher's replies are texts the grammar allows, so a warm start teaches what the sampler may write; choices that
cannot be held are refused before any model work."""

from __future__ import annotations

import json

import jsonschema
import pytest

from environments.email.env import MAX_TOKENS, EmailEnvironment
from service.backends.openai_server import ChatCompletionRequest, ServingError
from service.backends.transformers import chat
from service.backends.transformers.generation import Generator, SamplingRequest
from service.backends.transformers.structured import Guide
from service.backends.transformers.template_chat import TemplateChat

PICK = {"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "required": ["colour"], "additionalProperties": False,
    "properties": {"colour": {"enum": ["red", "green", "blue"]},
                   "count": {"type": "integer", "minimum": 0, "maximum": 9}},
}}}  # fmt: skip
NOTE = {"type": "function", "function": {"name": "note", "parameters": {
    "type": "object", "required": ["text"], "additionalProperties": False,
    "properties": {"text": {"type": "string", "maxLength": 6}},
}}}  # fmt: skip
TOOLS = chat.tools_as_trained([PICK, NOTE])
SCHEMAS = {tool["function"]["name"]: tool["function"]["parameters"] for tool in TOOLS}
MESSAGES = [{"role": "user", "content": "Pick a colour, or take a note."}]


@pytest.fixture(scope="module")
def lm(tiny_lm):
    from transformers import AutoModelForCausalLM

    from service.backends.transformers.models import load_tokenizer

    tokenizer = load_tokenizer(tiny_lm)
    chat.add_tool_support(tokenizer)
    return AutoModelForCausalLM.from_pretrained(str(tiny_lm)).eval(), tokenizer


def _replies(lm, tool_choice, *, n: int) -> list:
    model, tokenizer = lm
    server = TemplateChat(lambda _: tokenizer)
    request = ChatCompletionRequest(model="m", messages=MESSAGES, tools=[PICK, NOTE], tool_choice=tool_choice, n=n,
                                    seed=4)  # fmt: skip
    sampling = server.sampling_request(request, max_tokens=120, stop=())
    [samples] = Generator(model, tokenizer, end_token_ids=chat.end_token_ids(tokenizer)).generate([sampling])
    return samples


def _calls(sample) -> list[dict]:
    parsed = chat.parse_tool_calls(sample.text, call_id_prefix="c")
    assert parsed.content is None and parsed.tool_calls, sample.text
    return [call["function"] for call in parsed.tool_calls]


def test_every_reply_under_required_is_calls_of_the_tools_with_valid_arguments(lm):
    samples = _replies(lm, "required", n=8)
    names = set()
    for sample in samples:
        assert sample.finish_reason == "stop", sample.text  # the end token, once the last call closed
        for call in _calls(sample):
            jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
            names.add(call["name"])
    assert names == {"pick", "note"}  # sampled among the tools, not one forced text
    # the model's own logprobs, unmasked: `<tool_call>` opens every reply, and was not certain to a random model
    assert all(sample.logprobs[0] < -1.0 for sample in samples)


def test_parallel_tool_calls_false_holds_a_required_reply_to_one_call(lm):
    model, tokenizer = lm
    guide = Guide(tokenizer, vocab_size=len(tokenizer), end_token_ids=chat.end_token_ids(tokenizer))
    two = '<tool_call>\n{"name": "note", "arguments": {"text": "a"}}\n</tool_call>\n' * 2
    for parallel, accepted in ((None, True), (True, True), (False, False)):
        matcher = guide.matcher(chat.tool_call_grammar("required", TOOLS, parallel))
        for token in tokenizer.encode(two.rstrip("\n"), add_special_tokens=False):
            matcher.advance(token)
        assert matcher.failed is not accepted, parallel
    request = ChatCompletionRequest(model="m", messages=MESSAGES, tools=[PICK, NOTE], tool_choice="required",
                                    parallel_tool_calls=False, n=16, seed=4)  # fmt: skip
    sampling = TemplateChat(lambda _: tokenizer).sampling_request(request, max_tokens=120, stop=())
    [samples] = Generator(model, tokenizer, end_token_ids=chat.end_token_ids(tokenizer)).generate([sampling])
    for sample in samples:
        assert sample.finish_reason == "stop" and len(_calls(sample)) == 1, sample.text


def test_a_named_function_gets_exactly_one_call_of_it(lm):
    for sample in _replies(lm, {"type": "function", "function": {"name": "note"}}, n=4):
        [call] = _calls(sample)
        assert call["name"] == "note" and len(json.loads(call["arguments"])["text"]) <= 6


def test_a_held_call_reads_back_as_the_template_renders_it(lm):
    """The text of a held reply is the template's rendering of its parsed calls: the next turn's prompt holds it as
    written (its tokens may split otherwise, as any sampled text's can)."""
    _, tokenizer = lm
    for sample in _replies(lm, "required", n=4):
        message = {"role": "assistant", "content": "", "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": call} for i, call in enumerate(_calls(sample))
        ]}  # fmt: skip
        rendered = chat.reply_token_ids(tokenizer, message, TOOLS)[:-1]  # without the end token: any of the model's
        assert tokenizer.decode(rendered) == tokenizer.decode(sample.token_ids[:-1]) == sample.text


def test_the_email_teachers_replies_are_what_the_grammar_allows(lm):
    """Every reply of 20 of the teacher's episodes, as a warm start trains on it, is a text the email environment's
    grammar (``required``, one call a reply) accepts, to its end token, well within its token limit."""
    _, tokenizer = lm
    environment = EmailEnvironment()
    tools = chat.tools_as_trained(list(environment.tools))
    guide = Guide(tokenizer, vocab_size=len(tokenizer), end_token_ids=chat.end_token_ids(tokenizer))
    grammar = chat.tool_call_grammar("required", tools, parallel_tool_calls=False)
    replies = [message for demo in environment.demonstrations(seed=0, count=20) for message in demo.messages()
               if message["role"] == "assistant"]  # fmt: skip
    assert len(replies) >= 60
    for message in replies:
        ids = chat.reply_token_ids(tokenizer, message, tools)
        matcher = guide.matcher(grammar)
        for token in ids:
            assert not matcher.failed, tokenizer.decode(ids)
            matcher.advance(token)
        assert not matcher.failed, tokenizer.decode(ids)
        assert len(ids) <= MAX_TOKENS // 2


@pytest.mark.parametrize(
    ("extra", "refusal"),
    [
        ({"tool_choice": "none"}, '"auto", "required" or'),
        ({"tool_choice": "always"}, '"auto", "required" or'),
        ({"tool_choice": {"type": "function", "function": "pick"}}, '"auto", "required" or'),
        ({"tool_choice": {"type": "function", "function": {"name": "paint"}}}, "no tool named 'paint'"),
        ({"tool_choice": "required", "tools": None}, "has no tools"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "both response_format and"),
        ({"tool_choice": "required", "tools": [{"type": "function", "function": {"name": "f", "parameters": {
            "type": "object", "properties": {"a": {"type": "nope"}}}}}]}, "tool_choice"),
    ],
)
def test_a_choice_that_cannot_be_held_is_refused_before_any_model_work(lm, extra, refusal):
    _, tokenizer = lm
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES, "tools": [PICK, NOTE]} | extra)
    with pytest.raises(ServingError) as refused:
        TemplateChat(lambda _: tokenizer).sampling_request(request, max_tokens=20, stop=())
    assert refused.value.status == 400 and refusal in refused.value.message, refused.value.message


def test_tools_nested_past_pythons_stack_are_refused_not_a_crash():
    from service.backends.transformers.structured import StructureError

    for depth in (3_000,):
        deep: dict = {"type": "object"}
        for _ in range(depth):
            deep = {"type": "object", "properties": {"a": deep}, "required": ["a"]}
        with pytest.raises(StructureError, match="tool_choice"):
            chat.tool_call_grammar("required", [{"type": "function", "function": {"name": "f", "parameters": deep}}])


def test_auto_and_absent_leave_the_reply_free(lm):
    _, tokenizer = lm
    for tool_choice in (None, "auto"):
        request = ChatCompletionRequest(model="m", messages=MESSAGES, tools=[PICK], tool_choice=tool_choice)
        assert TemplateChat(lambda _: tokenizer).sampling_request(request, max_tokens=5, stop=()).grammar is None
