"""Process settings, from ``ARTSVC_*`` environment variables or a ``.env`` file."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ARTSVC_", env_file=".env", extra="ignore")

    data_dir: Path = Field(Path(".artsvc"), description="Checkpoints, caches and the default SQLite database live here.")
    database_url: str | None = Field(
        None, description="SQLAlchemy URL of the store; default: a SQLite file artsvc.db in data_dir."
    )
    lease_seconds: int = Field(60, gt=0, description="How long a worker's claim on a job lasts without a heartbeat.")

    @field_validator("data_dir")
    @classmethod
    def _expand(cls, value: Path) -> Path:
        return value.expanduser()

    @property
    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'artsvc.db').resolve()}"


@lru_cache
def get_settings() -> Settings:
    return Settings()
