"""How trajectories become training tokens: what is trainable, and what survives truncation."""

import math

from openai.types.chat.chat_completion import Choice
from openai.types.chat.chat_completion_message import ChatCompletionMessage

from service.backends.embedded.sequences import collate, tokenize_trajectory
from service.backends.embedded.tokenizer import ASSISTANT, EOT, UNK, decode, encode_text, render_prompt


def choice(text: str, finish_reason: str = "stop", stop_reason: str | None = None) -> Choice:
    c = Choice(index=0, finish_reason=finish_reason, message=ChatCompletionMessage(role="assistant", content=text))
    if stop_reason is not None:
        c.stop_reason = stop_reason  # as the embedded server reports it
    return c


def trainable_text(seq) -> str:
    return decode(t for t, train in zip(seq.ids, seq.trainable) if train)


def test_only_sampled_turns_are_trainable_in_rl_and_every_assistant_turn_in_sft():
    conversation = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "scripted"},
        {"role": "user", "content": "again"},
        choice("sampled one"),
        {"role": "tool", "content": "result"},
        choice("sampled two", finish_reason="length"),
    ]
    rl = tokenize_trajectory(conversation, train_on_messages=False)
    assert trainable_text(rl) == "sampled onesampled two"
    # a turn that ended on <eot> trains the decision to stop; one cut by the length cap does not
    ends = [i for i, (t, train) in enumerate(zip(rl.ids, rl.trainable)) if train and t == EOT]
    assert len(ends) == 1
    sft = tokenize_trajectory(conversation, train_on_messages=True)
    assert trainable_text(sft) == "scriptedsampled onesampled two"


def test_a_turn_ended_by_a_stop_string_does_not_train_end_of_turn():
    seq = tokenize_trajectory([{"role": "user", "content": "q"}, choice("Final: 5", stop_reason="\n")], train_on_messages=False)
    assert EOT not in [t for t, train in zip(seq.ids, seq.trainable) if train]


def test_missing_logprobs_are_marked_unknown():
    seq = tokenize_trajectory([{"role": "user", "content": "q"}, choice("ab")], train_on_messages=False)
    assert all(math.isnan(lp) for lp, train in zip(seq.old_logprobs, seq.trainable) if train)


def test_long_conversations_are_truncated_from_the_left_keeping_the_latest_turn():
    conversation = [{"role": "user", "content": "x" * 500}, choice("the latest reply")]
    seq = tokenize_trajectory(conversation, train_on_messages=False)
    batch = collate([seq], block_size=64)
    assert batch.inputs.shape == (1, 64)
    assert decode(batch.targets[0][batch.mask[0] > 0].tolist()) == "the latest reply"


def test_prompt_rendering_and_unknown_characters():
    ids = render_prompt([{"role": "user", "content": "2 + 2 = ×"}])
    assert ids[-1] == ASSISTANT and ids[-3] == UNK
    assert decode(encode_text("Final: 4")) == "Final: 4"
