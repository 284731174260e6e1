"""Character tokenizer and chat template of the embedded policy.

One token per printable ASCII character, plus a few special tokens that frame chat turns.
A conversation renders as ``<role> content <eot>`` per message, and a generation prompt ends
with ``<assistant>``. An assistant turn's tool calls render after its content in the text
convention of :mod:`toolcalls`; tool results are ``<tool>`` turns. Tool *definitions* are not
rendered: a 192-character context has no room for JSON schemas, so the embedded policy learns
its tools from demonstrations (a GPU model's chat template renders them as usual). Characters
outside the vocabulary become ``<unk>`` on the prompt side; the policy can only *emit* ASCII
characters and ``<eot>``.

What the policy does not see (:func:`policy_sees`): ``system`` (and ``developer``) messages and
few-shot example turns (messages whose ``name`` is ``example_user`` or ``example_assistant``, see
:mod:`environments.prompts`) are skipped, in prompts and in training windows alike. Environments
write those for pretrained instruct models. The character policy learns the reply format from
warm-start demonstrations that open the same way, so the same parts are dropped when it is taught
and when it samples, and its short context has no room for instructions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from environments.prompts import is_example
from service.backends.embedded import toolcalls

PAD, EOT, SYSTEM, USER, ASSISTANT, TOOL, UNK = range(7)
SPECIAL_TOKENS = ("<pad>", "<eot>", "<system>", "<user>", "<assistant>", "<tool>", "<unk>")
CHARS = "\n\t" + "".join(chr(c) for c in range(32, 127))
VOCAB_SIZE = len(SPECIAL_TOKENS) + len(CHARS)
ROLE_TOKENS = {"system": SYSTEM, "developer": SYSTEM, "user": USER, "assistant": ASSISTANT, "tool": TOOL}

_CHAR_TO_ID = {ch: i + len(SPECIAL_TOKENS) for i, ch in enumerate(CHARS)}
_ID_TO_CHAR = {i: ch for ch, i in _CHAR_TO_ID.items()}
EMITTABLE_IDS = (EOT, *sorted(_ID_TO_CHAR))


def encode_text(text: str) -> list[int]:
    """Token ids of ``text``; unknown characters map to ``<unk>``."""
    return [_CHAR_TO_ID.get(ch, UNK) for ch in text]


def decode_token(token_id: int) -> str:
    """The text of one token ('' for special tokens)."""
    return _ID_TO_CHAR.get(token_id, "")


def decode(ids: Iterable[int]) -> str:
    return "".join(_ID_TO_CHAR.get(i, "") for i in ids)


def policy_sees(message: Mapping[str, Any]) -> bool:
    """Whether the policy reads ``message``: not a system or developer message, not a few-shot example turn."""
    return ROLE_TOKENS.get(str(message.get("role", "user"))) != SYSTEM and not is_example(message)


def render_message(message: Mapping[str, Any]) -> list[int]:
    """Tokens of one finished chat message: role token, content, end of turn (whether the policy
    sees it at all is :func:`policy_sees`'s call)."""
    role = ROLE_TOKENS.get(str(message.get("role", "user")), USER)
    content = message.get("content") or ""
    if not isinstance(content, str):  # OpenAI content parts: keep the text parts
        content = "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    if role == ASSISTANT and message.get("tool_calls"):
        content = toolcalls.render(content, message["tool_calls"])
    return [role, *encode_text(content), EOT]


def render_prompt(messages: Iterable[Mapping[str, Any]]) -> list[int]:
    """Tokens of a conversation (the messages :func:`policy_sees`) followed by the assistant generation prompt."""
    ids: list[int] = []
    for message in messages:
        if policy_sees(message):
            ids.extend(render_message(message))
    ids.append(ASSISTANT)
    return ids


def prompt_budget(block_size: int, max_tokens: int) -> int:
    """How many prompt tokens a sample conditions on at most: the rest of the context is the reply's.

    A quarter of the context is always left for the reply, whatever ``max_tokens`` says, so
    that a turn starts at the same position whether it was sampled (by the server) or
    demonstrated (for the trainer, which does not know the sampler's ``max_tokens``). With
    learned absolute positions that matters: a reply at positions training never showed is
    garbage.
    """
    return block_size - max(max_tokens, block_size // 4)
