"""Email episodes: bad policy output is answered and counted, scripted agents set the ceiling and the
floor, demonstrations are deterministic, and a real (untrained) policy plays a whole rollout."""

from __future__ import annotations

import json
from collections import Counter

import art
import pytest
from openai.types.chat.chat_completion import Choice

from environments.base import Sampling
from environments.email import EmailEnvironment
from environments.email.agents import demonstrator, oracle, play, random_agent
from environments.email.episode import ALREADY_ANSWERED, NO_TOOL_CALL, TOO_MANY_CALLS, Episode


@pytest.fixture(scope="module")
def env():
    return EmailEnvironment()


@pytest.fixture(scope="module")
def val(env):
    return list(env.scenarios("val"))


def tool_call(name, arguments, call_id="call_0"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


BAD_CALLS = [
    ("search_inbox", "{keywords: flight}"),  # malformed JSON
    ("search_inbox", '"flight"'),  # not an object
    ("delete_inbox", "{}"),  # unknown tool
    ("search_inbox", '{"keywords": 5}'),  # wrong type
    ("search_inbox", '{"query": "flight"}'),  # wrong field
    ("read_email", '{"message_id": ["a001"]}'),
    ("read_email", '{"message_id": "z999"}'),  # unknown message
    ("read_email", '{"message_id": "flight Krakow"}'),  # a query where an id goes
    ("search_inbox", json.dumps({"keywords": "x" * 100_000})),  # 100 KB
    ("search_inbox", '{"keywords": "*"}'),  # no word left
    ("search_inbox", '{"keywords": "flight", "sent_after": "2024-02-30"}'),
    ("return_final_answer", '{"answer": 42, "source_ids": []}'),
    ("return_final_answer", '{"answer": "x"}'),
    (None, None),
]
FTS_AND_SQL = ['"unbalanced', "NEAR(", "a OR", "*flight", "flight*", "'; DROP TABLE messages; --", "x:y", "-", "NOT"]


def test_bad_calls_are_answered_as_tool_errors_and_counted(val):
    scenario = val[0]
    episode = Episode(scenario, max_turns=50)
    for n, (name, arguments) in enumerate(BAD_CALLS):
        (reply,) = episode.step([tool_call(name, arguments, f"call_{n}")])
        assert reply["role"] == "tool" and reply["tool_call_id"] == f"call_{n}"
        assert reply["content"].startswith("error: ") and len(reply["content"]) < 120, reply
    assert episode.invalid_tool_calls == len(BAD_CALLS) and episode.turns == len(BAD_CALLS)
    for keywords in FTS_AND_SQL:  # valid calls: they run, find something or nothing, and break nothing
        (reply,) = episode.step([tool_call("search_inbox", json.dumps({"keywords": keywords}))])
        content = reply["content"]
        assert content == "no results" or content[0] in "abcd" or content == "error: keywords must contain a word"
    assert not episode.done
    result = episode.result()
    assert result.metrics["invalid_tool_calls"] >= len(BAD_CALLS) and result.outcome == "no_answer"


def test_turn_without_tool_calls_and_other_misuse(val):
    episode = Episode(val[0], max_turns=3)
    assert episode.step(None) == [{"role": "user", "content": NO_TOOL_CALL}]
    assert episode.step([]) == [{"role": "user", "content": NO_TOOL_CALL}]
    read = json.dumps({"message_id": val[0]["source_ids"][0]})
    calls = [tool_call("read_email", read, f"c{i}") for i in range(6)]
    replies = episode.step(calls)
    assert [r["tool_call_id"] for r in replies] == [f"c{i}" for i in range(6)]
    assert [r["content"] for r in replies[4:]] == [TOO_MANY_CALLS] * 2
    assert episode.done and episode.ran_out_of_turns and episode.turns == 3
    assert episode.invalid_tool_calls == 2 + 2 and episode.session.read == val[0]["source_ids"][:1]
    result = episode.result()
    assert result.metrics["ran_out_of_turns"] is True and result.outcome == "no_answer" and result.reward < 0


def test_calls_after_the_final_answer(val):
    scenario = val[0]
    episode = Episode(scenario, max_turns=6)
    answer = json.dumps({"answer": scenario["answer"], "source_ids": scenario["source_ids"]})
    replies = episode.step([tool_call("return_final_answer", answer, "x"), tool_call("read_email", "{}", "y")])
    assert [r["content"] for r in replies] == ["ok", ALREADY_ANSWERED]
    assert episode.done and not episode.ran_out_of_turns and episode.invalid_tool_calls == 1
    result = episode.result()
    assert result.outcome == "correct" and result.metrics["sources_read"] == 0  # correct, but nothing was read
    assert result.reward == pytest.approx(1.0 - 0.05)
    assert episode.step([tool_call("read_email", "{}")])[0]["content"] == "error: episode over"


def test_every_way_of_missing_the_answer_scores_as_running_out_of_turns(val):
    scenario = val[0]
    unanswered = Episode(scenario, max_turns=1)
    unanswered.step([tool_call("search_inbox", json.dumps({"keywords": "flight"}))])
    none = unanswered.result()
    assert none.outcome == "no_answer" and none.metrics["ran_out_of_turns"] and none.reward == pytest.approx(-0.2)
    over_cited = ["a001", "a002", "a003", *scenario["source_ids"]]  # the right answer, citing one id too many
    for answer, cited, outcome in [("not it", [], "wrong_answer"), (scenario["answer"], over_cited, "too_many_citations"),
                                   (scenario["answer"], [], "uncited")]:  # fmt: skip
        answered = Episode(scenario, max_turns=6)
        answered.step([tool_call("return_final_answer", json.dumps({"answer": answer, "source_ids": cited}))])
        result = answered.result()
        assert result.outcome == outcome and result.reward == pytest.approx(none.reward), outcome


def test_tool_calls_as_openai_objects(val):
    from openai.types.chat.chat_completion_message_tool_call import ChatCompletionMessageToolCall, Function

    episode = Episode(val[0], max_turns=6)
    keywords = val[0]["keywords"][0]
    function = Function(name="search_inbox", arguments=json.dumps({"keywords": keywords}))
    call = ChatCompletionMessageToolCall(id="abc", type="function", function=function)
    (reply,) = episode.step([call])
    assert reply["tool_call_id"] == "abc" and val[0]["source_ids"][0] in reply["content"]
    assert episode.invalid_tool_calls == 0 and episode.session.searches == 1


def test_max_turns_is_validated():
    for bad in (0, 51, -1, 2.5, "6", True, None):
        with pytest.raises(ValueError):
            EmailEnvironment(max_turns=bad)
    assert EmailEnvironment(max_turns=1).max_turns == 1 and EmailEnvironment().max_turns == 6


def accuracy(agent, scenarios) -> float:
    return sum(play(s, agent, seed=i).result.outcome == "correct" for i, s in enumerate(scenarios)) / len(scenarios)


def test_oracle_random_and_demonstrator_accuracy_on_val(val):
    assert accuracy(oracle, val) >= 0.95
    assert accuracy(random_agent, val) < 0.10
    assert 0.6 <= accuracy(demonstrator, val) < 0.95  # good, not perfect


def test_oracle_conversation_is_openai_format_and_finds_the_answer_by_reading(val):
    scenario = next(s for s in val if len(s["source_ids"]) == 2)
    played = play(scenario, oracle)
    messages = played.messages
    assert messages[0] == {"role": "user", "content": scenario["question"]}
    assistant = [m for m in messages if m["role"] == "assistant"]
    assert all(m["content"] == "" and len(m["tool_calls"]) == 1 for m in assistant)
    names = [m["tool_calls"][0]["function"]["name"] for m in assistant]
    assert names[0] == "search_inbox" and names[-1] == "return_final_answer" and names.count("search_inbox") == 2
    for m in messages[1:]:
        if m["role"] == "assistant":
            (tc,) = m["tool_calls"]
            assert set(tc) == {"id", "type", "function"} and tc["type"] == "function"
            assert isinstance(json.loads(tc["function"]["arguments"]), dict)
        else:
            assert m["role"] == "tool" and m["tool_call_id"] == tc["id"]
    assert played.result.outcome == "correct" and played.result.reward == pytest.approx(1.3)
    final = json.loads(assistant[-1]["tool_calls"][0]["function"]["arguments"])
    assert set(final["source_ids"]) == set(scenario["source_ids"])


def test_demonstrations_are_deterministic_for_a_seed(env):
    first = list(env.demonstrations(seed=7, count=40))
    again = list(env.demonstrations(seed=7, count=40))
    other = list(env.demonstrations(seed=8, count=40))
    assert [d.messages_and_choices for d in first] == [d.messages_and_choices for d in again]
    assert [d.messages_and_choices for d in first] != [d.messages_and_choices for d in other]
    train_questions = {s["question"] for s in env.scenarios("train")}
    assert all(d.messages_and_choices[1]["content"] in train_questions for d in first)
    for demo in first:  # each opens as a rollout of its question does
        assert demo.messages_and_choices[:2] == env.opening({"question": demo.messages_and_choices[1]["content"]})
    outcomes = Counter(d.metadata["outcome"] for d in env.demonstrations(seed=1, count=400))
    assert 0.7 < outcomes["correct"] / 400 < 0.95 and outcomes["wrong_answer"] > 0
    assert all(isinstance(m, dict) for d in first for m in d.messages_and_choices)
    assert env.tools == tuple(first[0].tools)


def test_tool_specs_are_valid_openai_tools(env):
    names = []
    for spec in env.tools:
        assert spec["type"] == "function" and set(spec["function"]) == {"name", "description", "parameters"}
        params = spec["function"]["parameters"]
        assert params["type"] == "object" and isinstance(params["properties"], dict)
        assert set(params.get("required", [])) <= set(params["properties"])
        names.append(spec["function"]["name"])
    assert names == ["search_inbox", "read_email", "return_final_answer"]
    search = env.tools[0]["function"]["parameters"]["properties"]
    assert set(search) == {"keywords", "from", "to", "sent_after", "sent_before"}


def test_the_tools_schemas_hold_every_message_id_and_every_teacher_call(env):
    """The schemas are as tight as the corpus allows and no tighter: every message's id has the id pattern, and every
    call of 200 teacher episodes (slips included) validates against its tool's parameters."""
    import jsonschema

    from environments.email.facts import MESSAGES_FILE, SCENARIO_DIR

    schemas = {spec["function"]["name"]: spec["function"]["parameters"] for spec in env.tools}
    id_schema = schemas["read_email"]["properties"]["message_id"]
    ids = [json.loads(line)["id"] for line in (SCENARIO_DIR / MESSAGES_FILE).read_text().splitlines()]
    assert len(ids) > 1000
    for message_id in ids:
        jsonschema.validate(message_id, id_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate("flight Krakow", id_schema)
    calls = [call["function"] for demo in env.demonstrations(seed=2, count=200) for message in demo.messages()
             for call in message.get("tool_calls") or []]  # fmt: skip
    assert {call["name"] for call in calls} == set(schemas) and len(calls) > 600
    for call in calls:
        jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])


@pytest.mark.asyncio
async def test_rollout_with_a_real_untrained_policy(tmp_path):
    from service.backends.embedded import EmbeddedBackend

    backend = EmbeddedBackend(path=tmp_path / "models", cache_dir=tmp_path / "cache", seed=0)
    model = art.TrainableModel(
        name="email", project="tests", base_model="embedded/char-gpt-0.2m", base_path=str(tmp_path / "art")
    )
    await model.register(backend)
    try:
        env = EmailEnvironment(max_turns=2)
        trajectory = await env.rollout(model, env.scenarios("val")[0], Sampling(temperature=1.0, seed=1))
    finally:
        await backend.close()
    choices = [m for m in trajectory.messages_and_choices if isinstance(m, Choice)]
    assert len(choices) == 2 and trajectory.messages_and_choices[:2] == env.opening(env.scenarios("val")[0])
    assert trajectory.metadata["outcome"] != "correct" and not env.is_correct(trajectory)
    assert trajectory.metadata["scenario_id"] == "email-val-0000"
    assert trajectory.metadata["scorer_version"] == env.scorer_version
    assert trajectory.metrics["ran_out_of_turns"] is True and trajectory.metrics["turns"] == 2
    assert trajectory.metrics["invalid_tool_calls"] > 0 and trajectory.metrics["correct"] is False
    assert trajectory.reward < 0
    assert all(isinstance(v, (int, float, bool)) for v in trajectory.metrics.values())
    assert len(trajectory.messages()) == len(trajectory.messages_and_choices)
