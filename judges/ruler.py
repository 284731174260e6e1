"""RULER made dependable: ART's judge (``art.rewards.ruler``) with what ART 0.5.18 leaves to the caller.

ART's ``ruler_score_group`` zips scores to trajectories by position, takes any number, raises when
the count is off and returns a group without the old group's exceptions and metadata. Here a group
is judged by calling ``art.rewards.ruler`` and then:

- scores are matched to trajectories by id; a missing, unknown or repeated id, or a count that
  differs, is a malformed answer (retried like invalid JSON);
- a finite score outside [0, 1] is clamped and the clamp recorded; a non-finite one is malformed;
- the group keeps its exceptions, metadata, metrics and logs, and every trajectory keeps its own
  reward as ``metrics["independent_reward"]`` beside ``metrics["ruler_score"]``;
- timeouts, rate limits (429, honouring ``Retry-After``), server and connection errors and
  malformed answers are retried with exponential backoff up to ``max_retries``; a group still
  unscored after that is returned as dropped, with the reason, never raised;
- calls of one job share a semaphore, so a job never has more than ``concurrency`` judge calls out;
- tokens and cost are counted per attempt (a malformed answer is paid for too), and every attempt is
  admitted and charged by the job's budget (judges/usage.py): once it is spent, groups are dropped
  unjudged, with the reason.

Prompt layout for provider caching: ART puts its rubric in the system message; here the tools the
agent had are appended to the rubric (instead of following each group's context), so the system
message is identical for every call of a job, and the user message starts with the shared context.
That layout is ``ruler.txt``, beside this module.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from dataclasses import dataclass
from importlib.resources import files
from typing import Any

import art
import pydantic
from art.rewards.ruler import DEFAULT_RUBRIC, TrajectoryScore, ruler

from judges.groups import rescore
from judges.judgement import GroupJudgement, Retry
from judges.usage import BudgetSpent, JudgeBudget, JudgeUsage, UsageMeter

EXPLANATION_CHARS = 300  # of an exact verdict's explanation: a small judge otherwise rambles to its token limit
SCORE_GRID = [i / 100 for i in range(101)]  # an exact verdict's scores: a number's digits are otherwise unbounded too
VERSION = "ruler-artsvc-1.0.0"  # bump when the judging semantics (prompt, matching, clamping) change
SYSTEM_WITH_TOOLS = files("judges").joinpath("ruler.txt").read_text(encoding="utf-8").removesuffix("\n")  # package data


@dataclass(frozen=True)
class JudgeConfig:
    """One job's judge: the model and rubric the job chose, and the operator's endpoint and limits."""

    model: str
    rubric: str | None = None
    api_base: str | None = None
    api_key: str | None = None
    timeout_s: float = 60.0
    max_retries: int = 4
    backoff_s: float = 1.0
    max_backoff_s: float = 30.0
    concurrency: int = 4
    exact_verdicts: bool = False  # ask for exact_verdict_format (an endpoint that holds replies to a JSON schema)

    def system_rubric(self, tools: list[Any] | None) -> str:
        """The judge's system message: the job's rubric (ART's by default), then the tools the agent had."""
        rubric = (self.rubric or DEFAULT_RUBRIC).strip()
        return SYSTEM_WITH_TOOLS.format(rubric=rubric, tools=json.dumps(tools, sort_keys=True)) if tools else rubric

    def litellm_params(self, verdicts: int) -> dict[str, Any]:
        """litellm's parameters for a call judging ``verdicts`` trajectories."""
        params: dict[str, Any] = {"timeout": self.timeout_s, "max_retries": 0}  # the retries are ours, not the SDK's
        if self.exact_verdicts:  # the body's response_format, in place of the generic one ART's ruler passes
            params["extra_body"] = {"response_format": exact_verdict_format(verdicts)}
        if self.api_base:
            params["api_base"] = self.api_base
        if self.api_key:
            params["api_key"] = self.api_key
        return params


def exact_verdict_format(count: int) -> dict[str, Any]:
    """The JSON schema of the verdicts ``apply_scores`` accepts for ``count`` judged trajectories, as a
    ``response_format``: RULER's fields in its order (the explanation before the score), ids 1..count each once in
    order, scores on SCORE_GRID (0, 0.01, ..., 1), explanations of at most EXPLANATION_CHARS. An endpoint that holds
    a reply to a schema (this service's own serving, vLLM) then gets a usable verdict of bounded length from any
    judge, however small; what is left to the judge is the judging. OpenAI's strict mode does not take these
    keywords: for local judges only."""
    def verdict(trajectory_id: int) -> dict[str, Any]:
        fields = {"trajectory_id": {"const": str(trajectory_id)},
                  "explanation": {"type": "string", "maxLength": EXPLANATION_CHARS},
                  "score": {"enum": SCORE_GRID}}  # fmt: skip
        return {"type": "object", "properties": fields, "required": list(fields), "additionalProperties": False}

    scores = {"type": "array", "prefixItems": [verdict(i) for i in range(1, count + 1)], "items": False,
              "minItems": count}  # fmt: skip
    schema = {"type": "object", "properties": {"scores": scores}, "required": ["scores"], "additionalProperties": False}
    return {"type": "json_schema", "json_schema": {"name": "Response", "schema": schema}}


class MalformedVerdict(ValueError):
    """The judge answered, but not with one valid score per trajectory."""


class RulerJudge:
    """Scores trajectory groups with RULER under a job's limits. One instance per job run."""

    def __init__(
        self, config: JudgeConfig, *, budget: JudgeBudget | None = None, rng: random.Random | None = None
    ) -> None:
        self.config = config
        self.budget = budget or JudgeBudget(None)
        self._slots = asyncio.Semaphore(config.concurrency)
        self._rng = rng or random.Random(0)  # jitter only

    async def judge(self, group: art.TrajectoryGroup) -> GroupJudgement:
        """Score ``group``; never raises for anything the judge does."""
        usage = JudgeUsage()
        retried: list[Retry] = []
        messages = [t.messages() for t in group.trajectories]
        tools = next((t.tools for t in group.trajectories if t.tools), None)
        rubric = self.config.system_rubric(tools)
        identical = all(m == messages[0] for m in messages)  # ART's ruler then sends (and scores) the first alone
        params = self.config.litellm_params(1 if identical else len(messages))
        for attempt in range(1, self.config.max_retries + 2):
            meter = UsageMeter(self.config.model)
            try:
                async with self._slots, self.budget.admitted(meter.usage):
                    with meter.activate_context():
                        scores = await asyncio.wait_for(
                            ruler(messages, judge_model=self.config.model, rubric=rubric,
                                  extra_litellm_params=params),
                            timeout=self.config.timeout_s,
                        )  # fmt: skip
                rescored, clamped = apply_scores(group, scores)
                usage.add(meter.usage)
                return GroupJudgement(rescored, attempt, usage, clamped=clamped, retried=retried)
            except BudgetSpent as exc:  # refused before the call: this attempt was not made
                return GroupJudgement(None, attempt - 1, usage, failure=str(exc), retried=retried)
            except Exception as exc:  # noqa: BLE001 -- every judge failure is classified, none escapes
                usage.add(meter.usage)
                kind, reason, retry_after = classify(exc)
                if kind is None or attempt > self.config.max_retries:
                    return GroupJudgement(None, attempt, usage, failure=reason, retried=retried)
                retried.append(Retry(kind, reason))
                await asyncio.sleep(self._delay(attempt, retry_after))
        raise AssertionError("unreachable: the last attempt returns")

    def _delay(self, attempt: int, retry_after: float) -> float:
        """The server's Retry-After when it gave one, else exponential backoff with jitter; capped."""
        if retry_after > 0:
            return min(retry_after, self.config.max_backoff_s)
        backoff = self.config.backoff_s * 2 ** (attempt - 1)
        return min(backoff * (0.5 + self._rng.random() / 2), self.config.max_backoff_s)


def classify(exc: BaseException) -> tuple[str | None, str, float]:
    """Why a judge call failed: its retry kind (judgement.RETRY_KINDS; None where retrying cannot help), the reason,
    and the seconds the server asked to wait before a retry (0 when it named none)."""
    import litellm

    reason = f"{type(exc).__name__}: {str(exc)[:300]}"
    if isinstance(exc, litellm.RateLimitError):
        return "rate_limited", reason, _retry_after_seconds(exc)
    if isinstance(exc, (asyncio.TimeoutError, litellm.Timeout)):
        return "timeout", f"timeout: {reason}", 0.0
    if isinstance(exc, (litellm.InternalServerError, litellm.ServiceUnavailableError, litellm.APIConnectionError)):
        return "server_error", reason, 0.0
    if isinstance(exc, (MalformedVerdict, pydantic.ValidationError, ValueError)):  # ART raises ValueError on a count
        return "malformed", f"malformed verdict: {reason}", 0.0
    return None, reason, 0.0  # authentication, a bad request, an unknown model


def _retry_after_seconds(exc: BaseException) -> float:
    headers = getattr(exc, "litellm_response_headers", None) or getattr(getattr(exc, "response", None), "headers", None)
    try:
        seconds = float((headers or {}).get("retry-after", ""))
    except (TypeError, ValueError):  # absent, or an HTTP date: fall back to our backoff
        return 0.0
    return seconds if math.isfinite(seconds) and seconds > 0 else 0.0


def apply_scores(group: art.TrajectoryGroup, scores: list[TrajectoryScore]) -> tuple[art.TrajectoryGroup, list[str]]:
    """The group rescored by trajectory id (RULER numbers them from 1), and the clamps it took.

    Raises MalformedVerdict unless there is exactly one finite score per trajectory."""
    expected = [str(i) for i in range(1, len(group.trajectories) + 1)]
    by_id: dict[str, TrajectoryScore] = {}
    for score in scores:
        if score.trajectory_id in by_id:
            raise MalformedVerdict(f"trajectory {score.trajectory_id!r} was scored twice")
        by_id[score.trajectory_id] = score
    if sorted(by_id) != sorted(expected):
        raise MalformedVerdict(f"scores for ids {sorted(by_id)[:20]}, but the trajectories are 1..{len(expected)}")
    clamped: list[str] = []
    rewards, metrics, logs = [], [], []
    for trajectory_id in expected:
        raw = by_id[trajectory_id].score
        if not math.isfinite(raw):
            raise MalformedVerdict(f"trajectory {trajectory_id} scored {raw}")
        score = min(max(raw, 0.0), 1.0)
        extra: dict[str, float] = {"ruler_score": score}
        if score != raw:
            clamped.append(f"trajectory {trajectory_id}: score {raw} outside [0, 1], clamped to {score}")
            extra["ruler_raw_score"] = raw
        rewards.append(score)
        metrics.append(extra)
        logs.append(f"RULER {score:.3f}: {by_id[trajectory_id].explanation}")
    return rescore(group, rewards, metrics=metrics, logs=logs), clamped
