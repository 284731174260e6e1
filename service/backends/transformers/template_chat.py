"""``TemplateChat``: the :class:`~service.backends.openai_server.ChatFormat` of a real LM, shared by the training
backend's policy server and the service's inference on trained checkpoints: prompts rendered by the model's chat
template, logprob tokens named ``token_id:N``, Hermes tool calls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.backends.openai_server import ChatCompletionRequest, ServingError
from service.backends.transformers import chat, structured
from service.backends.transformers.generation import SamplingRequest
from service.backends.transformers.literal_prompt import ControlTokenInText, render_literal_prompt
from service.backends.transformers.sampled_replies import SampledReplies


class TemplateChat:
    """Reads requests for the tokenizer ``tokenizer_for(model)`` returns (ServingError for an unknown model).

    With ``max_context``, a prompt whose tokens plus ``max_tokens`` pass it is refused (400) instead of sampled past
    the model's positions. With ``literal_text`` (the API's serving path) the caller's strings are tokenized as text,
    never as control tokens (literal_prompt.py); the training policy server keeps ART's tokenisation, and with
    ``replies_for`` writes the replies its sampler drew back into a prompt as drawn (sampled_replies.py)."""

    def __init__(
        self,
        tokenizer_for: Callable[[str], Any],
        *,
        max_context: int | None = None,
        literal_text: bool = False,
        replies_for: Callable[[str], SampledReplies] | None = None,
    ) -> None:
        self._tokenizer_for, self._max_context, self._replies_for = tokenizer_for, max_context, replies_for
        self._render = render_literal_prompt if literal_text else chat.render_prompt

    def sampling_request(
        self, request: ChatCompletionRequest, *, max_tokens: int, stop: tuple[str, ...]
    ) -> SamplingRequest:
        tokenizer = self._tokenizer_for(request.model)
        if request.tools and not chat.renders_tools(tokenizer):
            raise ServingError(400, "this model's chat template renders no tools", "tools_not_supported")
        try:
            tools = chat.tools_as_trained(request.tools)
        except ValueError as exc:  # pydantic's ValidationError
            raise ServingError(400, f"invalid tools: {exc}"[:500], "invalid_request") from None
        try:
            prompt = self._render(tokenizer, request.messages, tools)
        except ControlTokenInText as exc:
            raise ServingError(400, f"invalid messages: {exc}", "invalid_request") from None
        except Exception as exc:  # a message the template cannot render (a missing field, a wrong type)
            raise ServingError(400, f"invalid messages: {type(exc).__name__}: {exc}"[:500], "invalid_request") from None
        if self._replies_for is not None:
            prompt = self._replies_for(request.model).splice(tokenizer, prompt, request.messages, tools)
        try:
            grammar = structured.grammar_for(request.response_format)
            calls = chat.tool_call_grammar(request.tool_choice, tools, request.parallel_tool_calls)
        except structured.StructureError as exc:
            raise ServingError(400, f"invalid request: {exc}", "invalid_request") from None
        if grammar is not None and calls is not None:
            raise ServingError(400, "invalid request: a reply cannot be held to both response_format and tool_choice",
                               "invalid_request")  # fmt: skip
        if self._max_context is not None and len(prompt) + max_tokens > self._max_context:
            raise ServingError(
                400, f"the prompt is {len(prompt)} tokens and max_tokens {max_tokens}: more than this model's context "
                f"of {self._max_context} tokens", "context_length_exceeded",
            )  # fmt: skip
        return SamplingRequest(
            prompt_ids=tuple(prompt), n=request.n, temperature=request.temperature, top_p=request.top_p,
            max_tokens=max_tokens, stop=stop, seed=request.seed, top_logprobs=request.top_logprobs or 0,
            grammar=grammar or calls,
        )  # fmt: skip

    def token_text(self, model: str, token_id: int) -> tuple[str, bytes]:
        """``token_id:N``, as vLLM's ``return_tokens_as_token_ids`` names tokens: ART reads the id back exactly."""
        return f"token_id:{token_id}", self._tokenizer_for(model).decode([token_id]).encode()

    def parse_tool_calls(self, text: str, *, call_id_prefix: str) -> chat.ParsedReply:
        return chat.parse_tool_calls(text, call_id_prefix=call_id_prefix)
