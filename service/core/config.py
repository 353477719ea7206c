"""The service's one settings object, read from the environment (and an optional .env file).

    DATABASE_URL                      sqlite:///gdn_sweep.db (default) or postgresql+psycopg://…
    RAY_ADDRESS                       empty: start a local Ray; else e.g. ray://head:10001, auto
    GDN_SWEEP_CPU_CHIPS               virtual CPU chips of that local Ray (default 8)
    GDN_SWEEP_MAX_CONCURRENT_TRIALS   trials a sweep runs at once (default 2)
    GDN_SWEEP_GRID_CAP                largest grid a POST /api/sweeps may ask for (default 512)
    GDN_SWEEP_API_TOKEN               bearer token required on mutating calls (empty: none)
    GDN_SWEEP_TOKEN_FOR_READS         true: every /api call needs the token, reads too (default
                                      false; /api/health and /metrics stay open)
    GDN_SWEEP_ALLOW_UNAUTHENTICATED   true: serve beyond loopback without a token on purpose
                                      (`serve --allow-unauthenticated`; the dashboard says so)
    GDN_SWEEP_RUN_SCHEDULER           run sweeps in this process (default true), and fire
                                      the schedules that are due
    GDN_SWEEP_SCHEDULE_POLL_S         how often due schedules are looked for (default 5 s)
    GDN_SWEEP_UPGRADE_ON_START        alembic upgrade head when the app starts (default true)
    GDN_SWEEP_MAX_REQUEST_BYTES       largest request body accepted (default 1048576; 413 above)
    GDN_SWEEP_ALLOWED_HOSTS           Host names served (default 127.0.0.1,localhost,::1; plus
                                      the address a connection came in on); others get 400
    GDN_SWEEP_ALLOWED_ORIGINS         origins besides the service's own whose pages may POST
                                      (default none; e.g. https://sweeps.example.com behind a proxy)
    GDN_SWEEP_RAY_DASHBOARD_PORT      port of a local Ray's dashboard (default Ray's: 8265, or
                                      the next free one); it listens on 127.0.0.1
    GDN_SWEEP_RAY_INCLUDE_DASHBOARD   start a local Ray's dashboard (default: if installed)
    GDN_SWEEP_LOG_LEVEL               debug, info (default), warning, error
    GDN_SWEEP_LOG_FORMAT              text (default: time level logger message key=value…) or json
    GDN_SWEEP_ARTIFACT_DIR            where profile traces are stored and served from (default
                                      ~/.cache/gdn-sweep/artifacts; the sweep driver writes there)
    GDN_SWEEP_SERVED_HOST             the address `serve --host` binds (serve sets it, for its own
                                      scheduler too); beyond loopback, webhooks may reach only
                                      global addresses
    GDN_SWEEP_WEBHOOK_ALLOWED_HOSTS   internal webhook receivers allowed all the same: host names,
                                      addresses or CIDR networks (default none)
    GDN_SWEEP_PROFILE_MAX_BYTES       bytes all profile traces may hold (default 20 GiB; oldest
                                      removed first); GDN_SWEEP_PROFILE_MAX_AGE_DAYS (default
                                      30) and GDN_SWEEP_PROFILE_MIN_FREE_BYTES (default 1 GiB:
                                      a trace that would leave less free is skipped)
    GDN_SWEEP_API_THREADS             threads per API worker serving requests, and requests let
                                      in at once (default 4); the database pool holds as many
                                      connections, plus 4
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.core.exposure import serves_beyond_loopback
from workers.profile_store import ProfileRetention, default_artifact_dir

NameList = Annotated[list[str], NoDecode]
"""A list read from the environment as comma-separated names (or a JSON list)."""


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
    token_for_reads: bool = False
    """Every /api call needs the token, reads included (health and /metrics excepted)."""
    allow_unauthenticated: bool = False
    """Serve beyond loopback without a token, on purpose: every mutating call is open to
    whoever reaches the port (the dashboard shows a banner saying so)."""
    run_scheduler: bool = True
    """Run queued sweeps from this process. Run exactly one scheduler per database."""
    upgrade_on_start: bool = True
    """Apply the Alembic migrations when the app starts."""
    scheduler_id: str = Field(default="service", min_length=1, max_length=100)
    """This scheduler's name in `sweeps.runner`, as `<id>@<host>:<pid>:<start time>`: each
    process is its own runner, whatever the id; a restarted service resumes at once the
    sweeps of its dead predecessor on the same host."""
    lease_s: float = Field(default=60.0, gt=0)
    """A sweep whose runner has not renewed its heartbeat for this long may be taken over
    (the runner died); runners renew every scheduler_poll_s."""
    scheduler_poll_s: float = Field(default=2.0, gt=0)
    """How often an idle scheduler looks for sweeps queued by other processes."""
    schedule_poll_s: float = Field(default=5.0, gt=0, le=3600)
    """How often a process that runs a scheduler fires the schedules that are due (a tick
    fires at most this late)."""
    ray_dashboard_port: int | None = Field(default=None, ge=1, le=65535)
    """Port of the dashboard of a local Ray (None: Ray's 8265, or the next free one). A local
    Ray listens on 127.0.0.1 only, dashboard included."""
    ray_include_dashboard: bool | None = None
    """Start a local Ray's dashboard (None: when its dependencies are installed)."""
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    """Level of the service's log (`--log-level` overrides it)."""
    log_format: Literal["text", "json"] = "text"
    """One line per record: `time level logger message key=value…`, or one JSON object."""
    api_threads: int = Field(default=4, ge=1, le=256)
    """Threads per API worker process that serve requests, and API requests it lets in at
    once (the rest queue); its database pool holds as many connections plus a few for the
    scheduler. Few: the routes are CPU-bound Python, and more threads only fight the event
    loop for the GIL (use `--workers` to use more cores)."""
    results_cache_entries: int = Field(default=256, ge=0, le=100_000)
    """JSON pages of GET /api/results, /api/regressions and /api/capacity kept per API
    process (0: none), each served only while no succeeded result has been written since
    (service/db/read_cache.py)."""
    spool_dir: str = "~/.cache/gdn-sweep/spool"
    """Local directory where trial results wait for the database (service/spool.py); a
    restarted service stores what its dead predecessor left there before resuming."""
    artifact_dir: str = Field(default_factory=default_artifact_dir)
    """Directory of trial artifacts (profile traces; results hold paths relative to it). The
    driver of a sweep writes where its DriverOptions.artifact_dir says, which reads the same
    GDN_SWEEP_ARTIFACT_DIR: give the service and `gdn-sweep run --db` the same value (on a
    cluster, a path the head node writes)."""
    profile_max_bytes: int = Field(default=ProfileRetention().max_bytes, ge=1)
    """Bytes all profile traces under artifact_dir may hold; the oldest go first beyond it."""
    profile_max_age_days: float = Field(default=ProfileRetention().max_age_days, gt=0)
    """Profile traces older than this are removed when the next one is stored."""
    profile_min_free_bytes: int = Field(default=ProfileRetention().min_free_bytes, ge=0)
    """A trace that would leave the artifact directory's disk less free is skipped (the
    trial's result is stored all the same)."""
    max_request_bytes: int = Field(default=1024 * 1024, ge=1)
    """Largest request body accepted; a longer one is refused with 413 (declared or streamed)."""
    allowed_hosts: NameList = ["127.0.0.1", "localhost", "::1"]
    """Host header names the service answers (port ignored; `*` accepts any). The address a
    connection arrived on is accepted too, so a service bound to an IP answers by that IP. An
    unknown Host gets 400: a page whose DNS name was rebound to this machine cannot read it."""
    allowed_origins: NameList = []
    """Origins (scheme://host[:port]) besides the service's own whose pages may send POST,
    PUT, PATCH and DELETE; other cross-origin ones get 403 (no cross-site cancel)."""
    served_host: str = "127.0.0.1"
    """The address the service is bound to (`serve --host` sets it). Beyond loopback, a
    webhook may reach only global addresses (service/regressions/destinations.py)."""
    webhook_allowed_hosts: NameList = []
    """Internal webhook receivers allowed even when the service serves beyond loopback: host
    names, addresses or CIDR networks (10.0.0.0/8)."""

    @model_validator(mode="after")
    def _reads_need_a_token(self) -> Settings:
        if self.token_for_reads and not self.api_token:
            raise ValueError("GDN_SWEEP_TOKEN_FOR_READS=true needs GDN_SWEEP_API_TOKEN: reads "
                             "cannot be put behind a token that is not set")
        return self

    @property
    def open_to_network(self) -> bool:
        """Served beyond loopback with no token: anyone who reaches the port may start and
        cancel sweeps (serve refuses it unless allow_unauthenticated)."""
        return serves_beyond_loopback(self.served_host) and not self.api_token

    def profile_retention(self) -> ProfileRetention:
        """The limits the sweep driver keeps profile traces within."""
        return ProfileRetention(max_bytes=self.profile_max_bytes,
                                max_age_days=self.profile_max_age_days,
                                min_free_bytes=self.profile_min_free_bytes)

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

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _lower(cls, value):
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("ray_address", "api_token")
    @classmethod
    def _strip(cls, value: str) -> str:
        return value.strip()

    @field_validator("allowed_hosts", "allowed_origins", "webhook_allowed_hosts", mode="before")
    @classmethod
    def _name_list(cls, value):
        if isinstance(value, str):
            value = json.loads(value) if value.lstrip().startswith("[") else value.split(",")
        return [name.strip().lower().rstrip("/") for name in value if name.strip()]


@lru_cache
def get_settings() -> Settings:
    """The settings of this process (read once)."""
    return Settings()
