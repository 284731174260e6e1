"""A multi-turn episode's next prompt holds its earlier replies as they were sampled, token for token.

ART trains every turn of an episode on the tokens the sampler drew (``token_id:N``), in the context of the tokens
drawn before them. The policy server renders each new turn's prompt from the conversation's text, and a reply's
text can tokenize otherwise than it was drawn: SmolLM2 under the email grammar writes ``"}`` ``}`` where the text
reads back as ``"`` ``}}``, in 17 of 32 base-model replies. The trainer then scores a turn in a context the
sampler never saw. So the training policy server remembers each reply's tokens, keyed by the prompt it followed and
its text, and splices them back where a later prompt renders that reply (what vLLM users get by sending token ids
back, "token in, token out").
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

from service.backends.transformers import chat

KEPT = 4096  # replies remembered: a step's rollouts and a validation's, many times over


def _key(prefix: list[int] | tuple[int, ...], text: str) -> bytes:
    digest = hashlib.blake2b(digest_size=16)
    digest.update(",".join(map(str, prefix)).encode())
    digest.update(b"\x00" + text.encode("utf-8", "surrogatepass"))
    return digest.digest()


class SampledReplies:
    """The tokens of the last KEPT replies one tokenizer's sampler drew, their end-of-turn token included."""

    def __init__(self, kept: int = KEPT) -> None:
        self._kept = kept
        self._tokens: OrderedDict[bytes, tuple[int, ...]] = OrderedDict()

    def remember(self, prompt_ids: tuple[int, ...] | list[int], text: str, token_ids: list[int]) -> None:
        """The reply ``text`` was drawn as ``token_ids`` after ``prompt_ids``."""
        key = _key(prompt_ids, text)
        self._tokens.pop(key, None)
        self._tokens[key] = tuple(token_ids)
        while len(self._tokens) > self._kept:
            self._tokens.popitem(last=False)

    def splice(
        self, tokenizer: Any, prompt_ids: list[int], messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None
    ) -> list[int]:
        """``prompt_ids`` (``messages`` rendered) with each assistant turn this sampler drew in that very context
        written as ART's tokeniser writes it: the drawn tokens, then the template's end of turn unless the reply
        ended with that very token (a reply cut at its limit, or ended by another end token, keeps both). Turns it
        did not draw, or cannot find, stay as rendered."""
        if not self._tokens:
            return prompt_ids
        ids, cursor = list(prompt_ids), 0
        for message in messages:
            if not isinstance(message, dict) or message.get("role") != "assistant":
                continue
            try:
                rendered = chat.reply_token_ids(tokenizer, message, tools)
            except Exception:  # noqa: BLE001 - a turn this template cannot render alone stays as rendered
                continue
            at = _find(ids, rendered, cursor)
            if at < 0:
                continue
            written = rendered
            drawn = self._tokens.get(_key(ids[:at], tokenizer.decode(rendered[:-1])))
            if drawn:
                written = list(drawn) if drawn[-1] == rendered[-1] else [*drawn, rendered[-1]]
                ids[at : at + len(rendered)] = written
            cursor = at + len(written)
        return ids


def _find(ids: list[int], part: list[int], start: int) -> int:
    """Where ``part`` first occurs in ``ids`` at or after ``start``; -1 if nowhere (or ``part`` is empty)."""
    if not part:
        return -1
    first, size = part[0], len(part)
    for at in range(start, len(ids) - size + 1):
        if ids[at] == first and ids[at : at + size] == part:
            return at
    return -1
