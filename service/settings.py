"""Process settings, from ``ARTSVC_*`` environment variables or a ``.env`` file."""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


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

    @field_validator("data_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    @model_validator(mode="after")
    def _refuse_open_local_mode(self) -> Settings:
        if self.local_mode and not is_loopback(self.host):
            raise ValueError(f"local_mode serves every request as the operator; refusing it on non-loopback host {self.host!r}")
        return self

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'artsvc.db').resolve()}"


@lru_cache
def get_settings() -> Settings:
    return Settings()
