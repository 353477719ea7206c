"""The database engine, sessions, and Alembic upgrades run from code.

SQLite gets WAL journaling, a busy timeout and foreign keys, so the scheduler thread and API
requests can write at the same time; PostgreSQL uses psycopg 3 with a pool sized to the
threads that use it.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

REPO_ROOT = Path(__file__).resolve().parents[2]
ALEMBIC_INI = REPO_ROOT / "alembic.ini"
MIGRATIONS_DIR = REPO_ROOT / "migrations"


def is_sqlite(url: str) -> bool:
    return make_url(url).get_backend_name() == "sqlite"


PG_CONNECT_TIMEOUT_S = 10
"""Seconds a new PostgreSQL connection may take (libpq connect_timeout)."""
POOL_SPARE = 4
"""Connections beyond one per request thread: the scheduler, its sinks, health checks."""


def make_engine(url: str, *, threads: int = 4, **kwargs) -> Engine:
    """Create the engine for `url` with this service's connection settings; on PostgreSQL a
    pool of one connection per thread that queries at once (`threads`) plus POOL_SPARE, so no
    request waits for a connection while its thread could run."""
    if is_sqlite(url):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30},
                               **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn, _record) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        return engine
    pool = {} if "poolclass" in kwargs else {"pool_size": threads + POOL_SPARE,
                                             "max_overflow": POOL_SPARE}
    # A database host that drops packets must fail fast (a 503), not after the OS TCP timeout.
    connect_args = {"connect_timeout": PG_CONNECT_TIMEOUT_S, **kwargs.pop("connect_args", {})}
    return create_engine(url, pool_pre_ping=True, connect_args=connect_args, **pool, **kwargs)


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config(url: str):
    """An Alembic Config for `url` that works from any working directory."""
    from alembic.config import Config

    cfg = Config(str(ALEMBIC_INI))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["database_url"] = url  # read by migrations/env.py; avoids ini %-escaping
    cfg.attributes["configure_logger"] = False
    return cfg


def upgrade_database(url: str, revision: str = "head") -> str | None:
    """Apply the migrations up to `revision` (creating a SQLite file if needed); return it."""
    from alembic import command

    if not MIGRATIONS_DIR.is_dir():
        raise FileNotFoundError(f"migrations not found at {MIGRATIONS_DIR}; install gdn-sweep "
                                "from a checkout (pip install -e .)")
    command.upgrade(alembic_config(url), revision)
    return current_revision(url)


def current_revision(url: str) -> str | None:
    """The Alembic revision the database is at (None before the first upgrade)."""
    from alembic.runtime.migration import MigrationContext

    engine = make_engine(url, poolclass=_null_pool())
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str | None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    # from alembic.ini, as the migrations run: its prepend_sys_path lets the revision scripts
    # import migrations.views
    return ScriptDirectory.from_config(Config(str(ALEMBIC_INI))).get_current_head()


def ping(engine: Engine) -> None:
    """Raise if the database cannot answer a trivial query."""
    with engine.connect() as conn:
        conn.execute(text("SELECT 1"))


def _null_pool():
    from sqlalchemy.pool import NullPool

    return NullPool
