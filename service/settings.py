"""Process settings, from ``ARTSVC_*`` environment variables or a ``.env`` file."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.spec import RewardSpec


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ARTSVC_", env_file=".env", extra="ignore")

    data_dir: Path = Field(Path(".artsvc"), description="Checkpoints, caches and the default SQLite database live here.")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL of the store; default: a SQLite file artsvc.db in data_dir."
    )
    lease_seconds: int = Field(60, gt=0, description="How long a worker's claim on a job lasts without a heartbeat.")

    host: str = Field("127.0.0.1", description="Address `artsvc serve` binds.")
    port: int = Field(8000, ge=0, le=65535, description="Port `artsvc serve` binds (0: any free port).")
    local_mode: bool = Field(
        False, description="Single-user mode: no tokens, every request acts as the operator. Refused beyond loopback."
    )
    api_url: str = Field("http://127.0.0.1:8000", description="Where `artsvc submit` and `artsvc watch` find the API.")
    token: str | None = Field(None, description="Bearer token `artsvc submit` and `artsvc watch` send.")
    max_body_bytes: int = Field(64 * 1024, gt=0, description="Largest request body the API accepts (413 beyond).")

    worker_concurrency: int = Field(1, gt=0, le=64, description="Jobs one worker trains at once.")
    poll_seconds: float = Field(1.0, gt=0, description="How often an idle worker looks for queued jobs.")
    trajectories_per_step: int = Field(8, ge=0, le=1024, description="Rollouts kept per step for operators to read.")
    alert_webhook_url: str | None = Field(None, description="Alerts are POSTed here as JSON, with retries.")

    # Judges are the operator's to configure: a job names one of judge_models, never an endpoint or a key.
    judge_models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Judge models jobs may name, comma-separated litellm names (e.g. openai/gpt-4o-mini); none: no judged jobs.",
    )
    judge_api_base: str | None = Field(
        None, description="OpenAI-compatible endpoint of the judges; unset, litellm's provider variables (OPENAI_BASE_URL...)."
    )
    judge_api_key: SecretStr | None = Field(None, description="Key for judge_api_base; unset, the provider's variable.")
    judge_timeout_s: float = Field(60.0, gt=0, le=3600, description="Seconds one judge call may take before it is retried.")
    judge_max_retries: int = Field(4, ge=0, le=20, description="Retries of a judge call (timeouts, 429, 5xx, malformed).")
    judge_concurrency: int = Field(4, gt=0, le=256, description="Judge calls one job may have out at once.")
    judge_backoff_s: float = Field(1.0, ge=0, le=60, description="First wait before retrying a judge call; it doubles.")

    # Baselines likewise: an evaluation or a job's baseline names one of baseline_models.
    baseline_models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Models evaluations and jobs' baselines may name, comma-separated litellm provider/model names.",
    )
    baseline_api_base: str | None = Field(
        None, description="OpenAI-compatible endpoint serving the baseline models; unset, the provider's own (litellm)."
    )
    baseline_api_key: SecretStr | None = Field(None, description="Key for baseline_api_base; unset, the provider's variable.")

    @field_validator("judge_models", "baseline_models", mode="before")
    @classmethod
    def _split_models(cls, value: object) -> object:
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()]
        return value

    @field_validator("data_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    @model_validator(mode="after")
    def _refuse_open_local_mode(self) -> Settings:
        if self.local_mode and not is_loopback(self.host):
            raise ValueError(f"local_mode serves every request as the operator; refusing it on non-loopback host {self.host!r}")
        return self

    def refuse_reward(self, reward: RewardSpec) -> str | None:
        """Why this server will not run a job with ``reward``: it names a judge model (RULER's, or a score_model
        grader's) that the operator does not allow. None if it may."""
        allowed = ", ".join(self.judge_models) or "none (the operator sets ARTSVC_JUDGE_MODELS)"
        if reward.judge_model is not None and reward.judge_model not in self.judge_models:
            return f"reward.judge_model: {reward.judge_model!r} is not a judge this server allows; allowed: {allowed}"
        if reward.grader is not None:
            from judges.graders import GraderConfigError, build_grader  # config models only: cheap to import

            try:
                build_grader(reward.grader, allowed_models=set(self.judge_models))
            except GraderConfigError as exc:
                return f"reward.grader: {exc}; allowed models: {allowed}"
        return None

    def refuse_baseline(self, model: str, *, field: str) -> str | None:
        """Why this server will not evaluate ``model`` (named in ``field``); None if it may."""
        if model in self.baseline_models:
            return None
        allowed = ", ".join(self.baseline_models) or "none (the operator sets ARTSVC_BASELINE_MODELS)"
        return f"{field}: {model!r} is not a baseline model this server allows; allowed: {allowed}"

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'artsvc.db').resolve()}"


@lru_cache
def get_settings() -> Settings:
    return Settings()
