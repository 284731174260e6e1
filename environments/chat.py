"""One assistant turn of a rollout: the request every environment makes of its policy.

Environments that talk to the policy over several turns call :func:`complete` once per turn
with the conversation so far (``trajectory.messages()``) and append the returned ``Choice`` to
the trajectory. Logprobs are always requested: trainers need the behaviour policy's logprob of
every sampled token.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from environments.base import Sampling

if TYPE_CHECKING:  # annotations only: ART and openai take seconds to import, and only a rollout needs them
    import art
    from openai.types.chat.chat_completion import Choice


async def complete(
    model: art.Model,
    messages: Sequence[dict[str, Any]],
    sampling: Sampling,
    *,
    max_tokens: int,
    tools: Sequence[dict[str, Any]] | None = None,
    tool_choice: str | None = None,
    parallel_tool_calls: bool | None = None,
) -> Choice:
    """The policy's next turn after ``messages``; ``sampling.max_tokens`` overrides ``max_tokens``. ``tool_choice``
    ``required`` asks for a reply that is tool calls, which a policy server with structured output holds it to;
    ``parallel_tool_calls`` False, to one call."""
    extra: dict[str, Any] = {"tools": list(tools)} if tools else {}
    if tool_choice is not None:
        extra["tool_choice"] = tool_choice
    if parallel_tool_calls is not None:
        extra["parallel_tool_calls"] = parallel_tool_calls
    response = await model.openai_client().chat.completions.create(
        model=model.get_inference_name(),
        messages=list(messages),
        max_tokens=sampling.max_tokens or max_tokens,
        temperature=sampling.temperature,
        seed=sampling.seed,
        logprobs=True,
        **extra,
    )
    return response.choices[0]
