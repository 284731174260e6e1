"""How much work one chat completion may ask for, checked before any model work: prompt tokens × n (each choice
holds the prompt's cache in memory) and n × max_tokens (the tokens decoded), each refused with a 400 naming the
limit and its setting; and a deadline after which the prompt's encoding (between chunks) or sampling (between tokens)
stops (service/inference/child.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from service.backends.openai_server import ServingError
from service.settings import Settings


@dataclass(frozen=True)
class Bounds:
    max_prompt_tokens: int  # prompt tokens × n
    max_completion_tokens: int  # n × max_tokens
    deadline_s: float  # from the prompt's encoding on; what is sampled by then is returned, finish_reason "length"

    @classmethod
    def of(cls, settings: Settings) -> Bounds:
        return cls(
            max_prompt_tokens=settings.inference_max_prompt_tokens,
            max_completion_tokens=settings.inference_max_completion_tokens,
            deadline_s=settings.inference_deadline_s,
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def check_completion(self, *, n: int, max_tokens: int) -> None:
        """ServingError 400 when ``n`` × ``max_tokens`` passes ``max_completion_tokens``."""
        if n * max_tokens > self.max_completion_tokens:
            raise _too_much(f"n × max_tokens is {n} × {max_tokens}", self.max_completion_tokens,
                            "ARTSVC_INFERENCE_MAX_COMPLETION_TOKENS")  # fmt: skip

    def check_prompt(self, *, prompt_tokens: int, n: int) -> None:
        """ServingError 400 when the prompt's tokens × ``n`` pass ``max_prompt_tokens``."""
        if prompt_tokens * n > self.max_prompt_tokens:
            raise _too_much(f"prompt tokens × n is {prompt_tokens} × {n}", self.max_prompt_tokens,
                            "ARTSVC_INFERENCE_MAX_PROMPT_TOKENS")  # fmt: skip


def _too_much(what: str, limit: int, setting: str) -> ServingError:
    return ServingError(400, f"invalid request: {what}, more than {limit} ({setting})", "request_too_large")
