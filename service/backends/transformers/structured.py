"""Replies held to a grammar: OpenAI's ``response_format`` (``json_schema`` or ``json_object``), and ``tool_choice``
(``required`` or a named function: the reply is tool calls whose arguments follow the tools' schemas). Every token is
drawn only from those that keep the reply a prefix of a text the grammar accepts, by llguidance's matcher over the
model's own tokenizer (the engine vLLM and SGLang use for structured output), and the reply ends when the text does.
A small model asked for JSON (a RULER judge served here) then always answers something a parser reads, and an agent
asked for a call always writes one that parses, as vLLM's guided decoding gives ART's agents on a GPU.

JSON is compact (no whitespace between tokens: a small model otherwise loops on newlines until its token limit).
A schema is a client's value: compiling it is bounded by llguidance's limits (LIMITS), a grammar past them is refused
(400) before any model work, and nothing in it is imported or run. Logprobs stay the model's own, unmasked, as the
trainer computes them.
"""

from __future__ import annotations

import functools
import json
import logging
from collections import OrderedDict
from collections.abc import Iterable
from copy import copy
from typing import Any

import llguidance
import numpy as np
import torch

logger = logging.getLogger(__name__)

# llguidance's own defaults, tightened for a shared server: lexer fuel (building a schema's regexes, and per token),
# Earley items per token and grammar symbols bound the CPU and memory one schema may cost.
LIMITS = {"initial_lexer_fuel": 200_000, "step_lexer_fuel": 100_000, "step_max_items": 20_000,
          "max_lexer_states": 50_000, "max_grammar_size": 50_000, "verbose_errors": False}  # fmt: skip
COMPACT = {"whitespace_flexible": False}
# A call's JSON as Python's json.dumps writes it: how a parsed call's arguments come back (chat.reply_token_ids), so a
# policy warm-started on demonstrations writes under the grammar exactly what it was taught.
AS_DUMPED = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
COMPILED_KEPT = 8  # grammars a model keeps compiled


def _limits() -> llguidance.LLParserLimits:
    return llguidance.LLParserLimits(**LIMITS)


class StructureError(ValueError):
    """A ``response_format`` or ``tool_choice`` this server cannot hold a reply to (the message says what, for a
    400)."""


def grammar_for(response_format: Any) -> str | None:
    """The llguidance grammar (its JSON text) ``response_format`` asks for; None for free text (absent, or
    ``{"type": "text"}``). StructureError for a malformed one, or a schema llguidance cannot compile within
    LIMITS."""
    if response_format is None:
        return None
    if not isinstance(response_format, dict):
        raise StructureError("response_format: an object is expected")
    kind = response_format.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        schema: Any = {"type": "object"}
    elif kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise StructureError("response_format.json_schema.schema: a JSON schema object is expected")
    else:
        raise StructureError("response_format.type: one of text, json_object, json_schema is expected")
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=COMPACT)  # type: ignore[arg-type]
    except (ValueError, TypeError) as exc:
        raise StructureError(f"response_format: {exc}"[:300]) from None
    return _followable(grammar, "response_format")


def tool_call_grammar(
    tool_choice: Any,
    tools: list[dict[str, Any]] | None,
    *,
    call_open: str,
    call_close: str,
    joiner: str,
    parallel_tool_calls: bool | None = None,
) -> str | None:
    """The llguidance grammar (its JSON text) ``tool_choice`` asks for over ``tools`` (OpenAI tools, validated): None
    for free text (absent, or ``auto``); for ``required``, one or more calls of any tool, joined by ``joiner`` (one
    call when ``parallel_tool_calls`` is False, as OpenAI reads it); for ``{"type": "function", "function": {"name":
    N}}``, one call of N, as vLLM reads them. A call is ``call_open``, then
    ``{"name": N, "arguments": A}`` with A held to the tool's parameters schema, then ``call_close``. StructureError
    for a malformed choice, a tool not in ``tools``, ``none`` (send no tools instead), or schemas past LIMITS."""
    if tool_choice is None or tool_choice == "auto":
        return None
    chosen = _chosen_functions(tool_choice, [tool["function"] for tool in tools or ()])
    body = {"x-guidance": AS_DUMPED, "anyOf": [
        {"type": "object", "required": ["name", "arguments"], "additionalProperties": False,
         "properties": {"name": {"const": f["name"]}, "arguments": f.get("parameters") or {"type": "object"}}}
        for f in chosen
    ]}  # fmt: skip
    if parallel_tool_calls not in (None, True, False):
        raise StructureError("parallel_tool_calls: true or false is expected")
    more = f"({json.dumps(joiner)} call)*" if tool_choice == "required" and parallel_tool_calls is not False else ""
    try:
        schema = json.dumps(body)
    except RecursionError:  # a client's schema nested past Python's stack: refused, as llguidance refuses deep ones
        raise StructureError("tool_choice: the tools' schemas are nested too deeply") from None
    return _lark_grammar(f"start: call {more}\ncall: {json.dumps(call_open)} body {json.dumps(call_close)}\n"
                         f"body: %json {schema}")  # fmt: skip


@functools.lru_cache(maxsize=COMPILED_KEPT)
def _lark_grammar(lark: str) -> str:
    """``lark`` compiled and checked (about 8 ms for the email tools): an agent sends the same tools turn after turn, so
    the last few are kept. A refusal is not kept."""
    try:
        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
    except (ValueError, TypeError) as exc:
        raise StructureError(f"tool_choice: {exc}"[:300]) from None
    return _followable(grammar, "tool_choice")


def _chosen_functions(tool_choice: Any, functions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The functions a ``required`` or named ``tool_choice`` allows; StructureError for any other choice."""
    if tool_choice == "required":
        if not functions:
            raise StructureError("tool_choice: required, but the request has no tools")
        return functions
    named = isinstance(tool_choice, dict) and tool_choice.get("type") == "function"
    function = tool_choice.get("function") if named else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise StructureError('tool_choice: "auto", "required" or {"type": "function", "function": {"name": ...}} '
                             "is expected")  # fmt: skip
    chosen = [f for f in functions if f["name"] == name]
    if not chosen:
        raise StructureError(f"tool_choice: the request has no tool named {name[:64]!r}")
    return chosen


def _followable(grammar: str, what: str) -> str:
    """``grammar``, once llguidance has checked that it compiles within LIMITS; StructureError if not."""
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, None, limits=_limits())
    if is_error:
        raise StructureError(f"{what}: the schema cannot be followed here: {messages[0]}"[:300])
    return grammar


def byte_level_json(tokenizer: Any) -> str:
    """The fast tokenizer's JSON, as llguidance reads the bytes of each token. A byte-level BPE read from a GGUF file
    (SmolLM2's) has a chain of decoders and ``byte_fallback`` set; llguidance then takes its tokens' characters
    literally (``Ġ`` for a space, ``đ`` for the control byte 0x11) and let raw control bytes into JSON strings. Its
    decoder is made the plain ByteLevel one its pre-tokenizer implies."""
    backend = copy(tokenizer.backend_tokenizer)
    backend.no_padding()
    backend.no_truncation()
    spec = json.loads(backend.to_str())
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    if any(step.get("type") == "ByteLevel" for step in steps):
        spec["decoder"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": True}
        spec["model"]["byte_fallback"] = False
    return json.dumps(spec)


class Guide:
    """Builds matchers for one model's tokenizer (wrapping SmolLM2's took 0.26 s: once per model)."""

    def __init__(self, tokenizer: Any, *, vocab_size: int, end_token_ids: Iterable[int]) -> None:
        vocab_size = max(vocab_size, len(tokenizer))  # tokens the tokenizer added past the model's rows are masked
        self._tokenizer = llguidance.LLTokenizer(byte_level_json(tokenizer), n_vocab=vocab_size,
                                                 eos_token=sorted(end_token_ids))  # fmt: skip
        self.vocab_size = vocab_size
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()

    def matcher(self, grammar: str) -> Matcher:
        """A matcher at the start of ``grammar``: a copy of one compiled before (a judge's schema comes call after
        call, a request's ``n`` replies share it), the last COMPILED_KEPT grammars kept."""
        compiled = self._compiled.pop(grammar, None)
        if compiled is None:
            compiled = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0, limits=_limits())
        self._compiled[grammar] = compiled
        while len(self._compiled) > COMPILED_KEPT:
            self._compiled.popitem(last=False)
        return Matcher(compiled.deep_copy(), self.vocab_size)


class Matcher:
    """One reply's place in its grammar."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int) -> None:
        self._matcher = matcher
        self._words = np.zeros((vocab_size + 31) // 32, dtype=np.int32)

    @property
    def failed(self) -> bool:
        """The matcher gave up (a limit passed mid-reply): the reply ends where it is."""
        if self._matcher.is_error():
            logger.warning("a structured reply stopped: %s", self._matcher.get_error())
            return True
        return False

    def mask(self, logits: torch.Tensor) -> None:
        """``logits`` (one row) set to -inf for every token the grammar does not allow next, in place; left alone once
        the matcher failed (the reply then ends: ``failed``)."""
        if self._matcher.is_error():
            return
        self._matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        allowed = np.unpackbits(self._words.view(np.uint8), bitorder="little")[: logits.shape[-1]]
        logits.masked_fill_(torch.from_numpy(allowed == 0).to(logits.device), -torch.inf)

    def advance(self, token: int) -> None:
        self._matcher.consume_token(token)

