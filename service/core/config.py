"""The service's one settings object, read from the environment (and an optional .env file).

    DATABASE_URL                      sqlite:///gdn_sweep.db (default) or postgresql+psycopg://…
    RAY_ADDRESS                       empty: start a local Ray; else e.g. ray://head:10001, auto
    GDN_SWEEP_CPU_CHIPS               virtual CPU chips of that local Ray (default 8)
    GDN_SWEEP_MAX_CONCURRENT_TRIALS   trials a sweep runs at once (default 2)
    GDN_SWEEP_GRID_CAP                largest grid a POST /api/sweeps may ask for (default 512)
    GDN_SWEEP_API_TOKEN               bearer token required on mutating calls (empty: none)
    GDN_SWEEP_RUN_SCHEDULER           run sweeps in this process (default true)
    GDN_SWEEP_UPGRADE_ON_START        alembic upgrade head when the app starts (default true)
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything the service reads from its environment."""

    model_config = SettingsConfigDict(env_prefix="GDN_SWEEP_", env_file=".env",
                                      env_file_encoding="utf-8", extra="ignore",
                                      populate_by_name=True)

    database_url: str = Field(
        default="sqlite:///gdn_sweep.db",
        validation_alias=AliasChoices("DATABASE_URL", "GDN_SWEEP_DATABASE_URL"))
    """SQLAlchemy URL; `postgresql://` is read as `postgresql+psycopg://` (psycopg 3)."""
    ray_address: str = Field(default="",
                             validation_alias=AliasChoices("RAY_ADDRESS", "GDN_SWEEP_RAY_ADDRESS"))
    """Ray cluster to run trials on; empty starts a local Ray inside the service."""
    cpu_chips: int | None = Field(default=None, ge=1)
    """Virtual CPU chips of a local Ray (GDN_SWEEP_CPU_CHIPS; the workers' default is 8)."""
    max_concurrent_trials: int = Field(default=2, ge=1, le=1024)
    """Trials of one sweep that run at the same time (Ray still waits for free chips)."""
    grid_cap: int = Field(default=512, ge=1)
    """Largest number of trials (frameworks × modes × chips × seq_lens) one sweep may have."""
    api_token: str = ""
    """Bearer token for POST calls; empty leaves the API open (fine on localhost only)."""
    run_scheduler: bool = True
    """Run queued sweeps from this process. Run exactly one scheduler per database."""
    upgrade_on_start: bool = True
    """Apply the Alembic migrations when the app starts."""
    scheduler_id: str = Field(default="service", min_length=1, max_length=100)
    """This scheduler's name in `sweeps.runner`; a restarted service resumes its own sweeps
    at once. Give each service that shares a database its own id."""
    lease_s: float = Field(default=60.0, gt=0)
    """A sweep whose runner has not renewed its heartbeat for this long may be taken over
    (the runner died); runners renew every scheduler_poll_s."""
    scheduler_poll_s: float = Field(default=2.0, gt=0)
    """How often an idle scheduler looks for sweeps queued by other processes."""

    @field_validator("database_url")
    @classmethod
    def _psycopg3(cls, url: str) -> str:
        url = url.strip()
        if not url:
            raise ValueError("DATABASE_URL is empty; use e.g. sqlite:///gdn_sweep.db or "
                             "postgresql+psycopg://user@host:5432/db")
        for prefix in ("postgresql://", "postgres://"):
            if url.startswith(prefix):
                return "postgresql+psycopg://" + url[len(prefix):]
        return url

    @field_validator("ray_address", "api_token")
    @classmethod
    def _strip(cls, value: str) -> str:
        return value.strip()


@lru_cache
def get_settings() -> Settings:
    """The settings of this process (read once)."""
    return Settings()
