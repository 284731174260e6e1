"""OpenAI content parts: text parts are read, anything else is refused saying what is wrong (before any model work)."""

from __future__ import annotations

import re

import pytest

from service.api.schemas import text_content


@pytest.mark.parametrize(("parts", "reason"), [
    ([{"type": "text"}], "a text content part's text must be a string"),
    ([{"type": "text", "text": 5}], "a text content part's text must be a string"),
    ([[1]], "content part of type 'list'"),
    ([{"type": "input_audio", "input_audio": {}}], "content part of type 'input_audio'"),
])  # fmt: skip
def test_a_malformed_content_part_is_refused_saying_what_is_wrong(parts, reason):
    with pytest.raises(ValueError, match=re.escape(reason)):
        text_content({"role": "user", "content": parts})
