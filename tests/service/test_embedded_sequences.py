"""How trajectories become training windows: what is trainable, what context each turn gets."""

import math

from art.trajectories import get_messages

from openai.types.chat.chat_completion import Choice, ChoiceLogprobs
from openai.types.chat.chat_completion_message import ChatCompletionMessage
from openai.types.chat.chat_completion_token_logprob import ChatCompletionTokenLogprob

from service.backends.embedded import toolcalls
from service.backends.embedded.sequences import TokenSequence, collate, trajectory_windows
from service.backends.embedded.tokenizer import ASSISTANT, EOT, UNK, decode, encode_text, prompt_budget, render_prompt


def choice(
    text: str, finish_reason: str = "stop", stop_reason: str | None = None, context_tokens: int | None = None, tools=False
) -> Choice:
    """A Choice as the embedded server returns it for ``text`` (logprobs list every emitted character)."""
    entries = [ChatCompletionTokenLogprob(token=c, logprob=-0.5, bytes=list(c.encode()), top_logprobs=[]) for c in text]
    parsed = toolcalls.parse(text, call_id_prefix="call") if tools else toolcalls.ParsedReply(text, [])
    message = ChatCompletionMessage(role="assistant", content=parsed.content, tool_calls=parsed.tool_calls or None)
    c = Choice(index=0, finish_reason=finish_reason, message=message, logprobs=ChoiceLogprobs(content=entries))
    c.stop_reason = stop_reason  # as the embedded server reports it
    if context_tokens is not None:
        c.context_tokens = context_tokens
    return c


def trainable_text(seq) -> str:
    return decode(t for t, train in zip(seq.ids, seq.trainable) if train)


def prompt_of(conversation) -> list[int]:
    """What the server renders for the next turn of ``conversation`` (as a rollout sends it)."""
    return render_prompt(get_messages(conversation))


def windows(conversation, block_size=192, train_on_messages=False):
    return trajectory_windows(conversation, block_size=block_size, train_on_messages=train_on_messages)


def test_only_sampled_turns_are_trainable_in_rl_and_every_assistant_turn_in_sft():
    conversation = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "scripted"},
        {"role": "user", "content": "again"},
        choice("sampled one"),
        {"role": "tool", "content": "result"},
        choice("sampled two", finish_reason="length"),
    ]
    (rl,) = windows(conversation)
    assert trainable_text(rl) == "sampled onesampled two"
    # a turn that ended on <eot> trains the decision to stop; one cut by the length cap does not
    ends = [i for i, (t, train) in enumerate(zip(rl.ids, rl.trainable)) if train and t == EOT]
    assert len(ends) == 1
    (sft,) = windows(conversation, train_on_messages=True)
    assert trainable_text(sft) == "scriptedsampled onesampled two"


def test_a_turn_ended_by_a_stop_string_does_not_train_end_of_turn():
    (seq,) = windows([{"role": "user", "content": "q"}, choice("Final: 5", stop_reason="\n")])
    assert EOT not in [t for t, train in zip(seq.ids, seq.trainable) if train]


def test_logprobs_come_from_the_server_and_missing_ones_are_marked_unknown():
    (seq,) = windows([{"role": "user", "content": "q"}, choice("ab")])
    trained = [lp for lp, train in zip(seq.old_logprobs, seq.trainable) if train]
    assert trained[:2] == [-0.5, -0.5] and math.isnan(trained[2])  # <eot> has no reported logprob
    bare = Choice(index=0, finish_reason="stop", message=ChatCompletionMessage(role="assistant", content="ab"))
    (seq,) = windows([{"role": "user", "content": "q"}, bare])
    assert trainable_text(seq) == "ab" and all(math.isnan(lp) for lp, t in zip(seq.old_logprobs, seq.trainable) if t)


def test_a_sampled_turn_is_trained_on_exactly_the_context_the_server_kept():
    conversation = [{"role": "user", "content": "x" * 500}]
    prompt = render_prompt(conversation)
    kept = 40
    (seq,) = windows([*conversation, choice("the latest reply", context_tokens=kept)], block_size=64)
    assert seq.ids[:kept] == prompt[-kept:]  # the very tokens the sampler conditioned on, from position 0
    assert trainable_text(seq) == "the latest reply"


def test_every_turn_of_a_long_conversation_is_trained_once_within_the_context():
    block = 64
    conversation, prompt_lengths = [], []
    for turn in range(12):
        conversation.append({"role": "user", "content": f"board {turn} " + "." * 20})
        prompt = prompt_of(conversation)
        kept = min(len(prompt), block - 16)  # what the sampler keeps with max_tokens=16
        prompt_lengths.append(kept)
        conversation.append(choice(f"<move>{turn:02d}</move>", context_tokens=kept))
    result = windows(conversation, block_size=block)
    assert "".join(trainable_text(w) for w in result) == "".join(f"<move>{t:02d}</move>" for t in range(12))
    assert all(len(w.ids) <= block + 1 for w in result)
    for w in result:  # each window starts with the exact context its first turn was sampled with
        first = trainable_text(w)[:11]
        turn = int(first[6:8])
        prompt = prompt_of(conversation[: 2 * turn + 1])
        assert w.ids[: prompt_lengths[turn]] == prompt[-prompt_lengths[turn] :]


def test_turns_that_saw_the_same_start_share_one_window():
    conversation = [{"role": "user", "content": "q1"}]
    conversation.append(choice("a1", context_tokens=len(prompt_of(conversation))))
    conversation += [{"role": "user", "content": "q2"}, choice("a2", context_tokens=len(prompt_of([*conversation, {"role": "user", "content": "q2"}])))]
    (seq,) = windows(conversation)
    assert trainable_text(seq) == "a1a2"


def test_demonstrations_get_the_context_the_sampler_would_keep():
    block = 64
    conversation = []
    for turn in range(30):
        conversation += [{"role": "user", "content": f"b{turn:02d}" + "." * 10}, {"role": "assistant", "content": f"m{turn:02d}"}]
    result = windows(conversation, block_size=block, train_on_messages=True)
    assert "".join(trainable_text(w) for w in result) == "".join(f"m{t:02d}" for t in range(30))
    assert len(result) < 30 and all(len(w.ids) <= block + 1 for w in result)  # the first turns share a window
    for w in result[1:]:  # later ones start where a sampled reply of the same length would
        turn = int(trainable_text(w)[1:3])
        prompt = prompt_of(conversation[: 2 * turn + 1])
        kept = prompt_budget(block, len("m00") + 1)
        assert w.ids[:kept] == prompt[-kept:] and len(prompt) > kept


def test_tool_calls_are_trained_as_written_and_rendered_back_the_same_way():
    text = 'Looking.<tool_call>search_inbox {"keywords": "flight"}</tool_call>'
    question = [{"role": "user", "content": "When?"}]
    sampled = choice(text, finish_reason="tool_calls", tools=True, context_tokens=len(prompt_of(question)))
    assert sampled.message.content == "Looking."
    assert sampled.message.tool_calls[0].function.name == "search_inbox"
    assert sampled.message.tool_calls[0].function.arguments == '{"keywords": "flight"}'
    conversation = [*question, sampled, {"role": "tool", "tool_call_id": "call_0", "content": "a1 2024-01-02 Flight"}]
    conversation.append(choice("Done", context_tokens=len(prompt_of(conversation))))
    (seq,) = windows(conversation)  # rendered back exactly as written, so the next turn shares the window
    assert trainable_text(seq) == text + "Done"


def test_tool_call_convention_parses_only_complete_calls():
    assert toolcalls.parse("no calls here", call_id_prefix="c").tool_calls == []
    cut = toolcalls.parse('<tool_call>read_email {"message_id": "a1"', call_id_prefix="c")
    assert cut.tool_calls == [] and cut.content.startswith("<tool_call>")
    two = toolcalls.parse('<tool_call>a {}</tool_call><tool_call>b not json</tool_call>', call_id_prefix="c")
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in two.tool_calls] == [
        ("c_0", "a", "{}"),
        ("c_1", "b", "not json"),
    ]
    assert two.content is None
    bad_name = toolcalls.parse("<tool_call>9lives {}</tool_call>", call_id_prefix="c")
    assert bad_name.tool_calls == []
    calls = [{"function": {"name": "f", "arguments": {"x": 1}}}, "junk", {"function": None}]
    assert toolcalls.render("", calls) == '<tool_call>f {"x": 1}</tool_call>'


def test_long_conversations_are_truncated_from_the_left_keeping_the_latest_turn():
    conversation = [{"role": "user", "content": "x" * 500}, choice("the latest reply")]
    batch = collate(windows(conversation, block_size=64), block_size=64)
    assert batch.inputs.shape[1] <= 64
    assert decode(batch.targets[0][batch.mask[0] > 0].tolist()) == "the latest reply"


def test_prompt_rendering_and_unknown_characters():
    ids = render_prompt([{"role": "user", "content": "2 + 2 = ×"}])
    assert ids[-1] == ASSISTANT and ids[-3] == UNK
    assert decode(encode_text("Final: 4")) == "Final: 4"


def test_the_policy_skips_system_prompts_and_few_shot_turns_when_sampling_and_when_taught():
    from environments.math import MathEnvironment

    env = MathEnvironment(level="subtraction")
    row = env.scenarios("val")[0]
    question = [{"role": "user", "content": row["prompt"]}]
    assert render_prompt(env.opening(row)) == render_prompt(question)
    assert render_prompt([{"role": "developer", "content": "be brief"}, *question]) == render_prompt(question)
    # a demonstration trains only its own reply, with the question alone as context, as a rollout samples it
    (demo,) = env.demonstrations(seed=0, count=1)
    (taught,) = windows(demo.messages_and_choices, train_on_messages=True)
    (bare,) = windows([demo.messages_and_choices[-2], demo.messages_and_choices[-1]], train_on_messages=True)
    assert (taught.ids, taught.trainable) == (bare.ids, bare.trainable)
    assert trainable_text(taught) == demo.messages_and_choices[-1]["content"]
    # a sampled turn after the examples is trained on the context the server rendered for it
    (rl,) = windows([*env.opening(row), choice("Final: 3", context_tokens=len(render_prompt(env.opening(row))))])
    assert rl.ids[: len(render_prompt(question))] == render_prompt(question)


def test_micro_batches_group_windows_of_like_length_and_give_the_gradient_of_one_pass():
    import torch

    from service.backends.embedded.engine import MAX_PADDING_RATIO, MICRO_BATCH_TOKENS, micro_batches
    from service.backends.embedded.objectives import sft_loss
    from service.backends.embedded.policy import PRESETS, CharGPT

    config = PRESETS["embedded/char-gpt-0.2m"]
    lengths = [29, 60, 28, 61, 30, 29, 300, 58, 37, 29, 193, 59] * 3  # a math warm start's two lengths, and long ones
    generator = torch.Generator().manual_seed(0)
    sequences = []
    for n in lengths:
        seq = TokenSequence()
        seq.extend(torch.randint(3, 60, (n,), generator=generator).tolist(), True)
        sequences.append(seq)
    runs = micro_batches(sequences, config.block_size)
    assert sorted(id(s) for run in runs for s in run) == sorted(id(s) for s in sequences)  # each window once
    for run in runs:
        widths = [min(len(s.ids), config.block_size + 1) for s in run]
        assert max(widths) <= MAX_PADDING_RATIO * min(widths) and len(run) * max(widths) <= MICRO_BATCH_TOKENS
    padded = sum(len(run) * max(min(len(s.ids), config.block_size + 1) for s in run) for run in runs)
    assert padded < 0.7 * len(sequences) * (config.block_size + 1)  # padded as one, every window would be 193 wide

    policy = CharGPT(config, seed=0)

    def gradient(chunks):
        policy.zero_grad()
        total = float(sum(s.truncated(config.block_size).trainable_tokens() for s in sequences))
        for chunk in chunks:
            sft_loss(policy, collate(chunk, config.block_size), total)[0].backward()
        return torch.cat([p.grad.flatten() for p in policy.parameters()])

    torch.testing.assert_close(gradient(runs), gradient([sequences]), rtol=1e-4, atol=1e-6)


def test_a_grpo_steps_reported_kl_is_exact_while_its_penalty_keeps_k3():
    """The KL a step reports is summed over the vocabulary (rl_measures.exact_kl), so it does not depend on which
    tokens were sampled; the penalty in the loss is still k3 over the sampled tokens."""
    import pytest
    import torch

    from service.backends.embedded.objectives import GRPOConfig, grpo_loss, token_logprobs
    from service.backends.embedded.policy import CharGPT, PolicyConfig

    config = PolicyConfig(n_layer=1, n_head=2, n_embd=32, block_size=32)
    policy, reference = CharGPT(config, seed=0), CharGPT(config, seed=1)
    sequences = []
    for text in ("the answer is 42", "move left, then up"):
        seq = TokenSequence()
        seq.extend(encode_text(text), True)
        sequences.append(seq)
    batch = collate(sequences, config.block_size)
    batch.advantages[:] = torch.tensor([1.0, -1.0])
    with torch.no_grad():
        new, mine = token_logprobs(policy, batch)
        ref, theirs = token_logprobs(reference, batch)
    terms = torch.nn.functional.kl_div(theirs, mine, log_target=True, reduction="none").nan_to_num(nan=0.0)
    exact = float((terms.sum(-1) * batch.mask).sum())  # a token neither can emit (-inf on both sides) adds 0
    k3 = float(((ref - new).exp() - (ref - new) - 1).mul(batch.mask).sum())
    _, sums = grpo_loss(policy, reference, batch, GRPOConfig(kl_penalty_coef=1.0), total_tokens=1.0)
    _, unpenalised = grpo_loss(policy, reference, batch, GRPOConfig(), total_tokens=1.0)
    assert exact > 0 and abs(exact - k3) > 1e-3 * exact  # the two differ on these tokens
    assert sums["kl"] == pytest.approx(exact, rel=1e-4)
    assert sums["loss"] - unpenalised["loss"] == pytest.approx(k3, rel=1e-4)
