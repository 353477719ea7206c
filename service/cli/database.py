"""How a `gdn-sweep` command opens its database, and how it says it could not.

`database_session(url)` / `open_database(url)`: the database migrated to head, then a session
(or a session factory), the engine disposed afterwards. `database_command(action)`: runs a
command's work and turns a database that is missing or cannot be reached into one line on
stderr and exit 1 (EXIT_NO_DATABASE), never a traceback; any other error propagates.

Which database a read command opens (`results`, `regressions`, `plan`, `schedule
list|show|…`): without `--db` or DATABASE_URL the service's default is
`sqlite:///gdn_sweep.db`, a file in the current folder: run anywhere but the checkout that
holds it, a read command would create an empty database there and report nothing. So a read
command says which database it opened when it was not told, and refuses a SQLite file that
does not exist, naming the path it looked for and how to point it elsewhere, creating nothing
(`database_to_read`). The commands that create a database on purpose (`serve`, `run --db`,
`import`, `db upgrade`, `schedule add`, `plan --fit`, the demo) do not ask it.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from service.core.exit_codes import EXIT_NO_DATABASE

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)


class MissingDatabase(Exception):
    """A SQLite database file that does not exist; str() is the one line to print."""


def shown_url(url: str) -> str:
    """A database URL as printed: its password hidden."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def sqlite_file(url: str) -> Path | None:
    """The file a SQLite URL names, made absolute against the current folder; None for
    another backend, an in-memory database, or a `file:` URI."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    database = parsed.database
    if parsed.get_backend_name() != "sqlite" or database in (None, "", ":memory:") \
            or database.startswith("file:"):
        return None
    return Path(database).resolve()


def database_to_read(database_url: str | None, *, err: TextIO) -> str:
    """The URL a read command opens: `database_url` (its --db), else DATABASE_URL, else the
    default, which is then named on `err`. Raises MissingDatabase where it is a SQLite file
    that does not exist (nothing is created)."""
    from service.core.config import Settings

    settings = Settings(**({} if database_url is None else {"database_url": database_url}))
    url = settings.database_url
    told = database_url is not None or "database_url" in settings.model_fields_set
    path = sqlite_file(url)
    if path is not None and not path.is_file():
        source = ("--db" if database_url is not None else "DATABASE_URL" if told else
                  "the default, sqlite:///gdn_sweep.db in the current folder")
        raise MissingDatabase(
            f"no database at {path} ({source}); nothing was created. Give the one to read with "
            f"--db URL (e.g. sqlite:////abs/path/gdn_sweep.db or "
            f"postgresql://user@host:5432/gdn_sweep) or set DATABASE_URL")
    if not told:
        where = f" ({path})" if path is not None else ""
        print(f"reading {shown_url(url)}{where}: the default; --db URL or DATABASE_URL reads "
              f"another", file=err)
    return url


@contextlib.contextmanager
def open_database(url: str, *, upgrade: bool = True) -> Iterator[sessionmaker[Session]]:
    """A session factory on the database at `url`, migrated to head first unless not
    `upgrade` (a SQLite file is created if missing: ask `database_to_read` before, where that
    must not happen); its engine is disposed on leaving."""
    from service.db.engine import make_engine, make_session_factory, upgrade_database

    if upgrade:
        log.info("database %s at revision %s", shown_url(url), upgrade_database(url))
    engine = make_engine(url)
    try:
        yield make_session_factory(engine)
    finally:
        engine.dispose()


@contextlib.contextmanager
def database_session(url: str) -> Iterator[Session]:
    """One session on the migrated database at `url` (open_database)."""
    with open_database(url) as session_factory, session_factory() as session:
        yield session


def database_command(action: Callable[[], int], *, err: TextIO) -> int:
    """`action()`'s exit code; when the database is missing (MissingDatabase) or cannot be
    reached (a transient error: service.db.errors), one line on `err` and EXIT_NO_DATABASE
    instead. Any other error propagates."""
    from service.db.errors import clean_error, is_transient

    try:
        return action()
    except MissingDatabase as missing:
        print(missing, file=err)
    except Exception as failed:
        if not is_transient(failed):
            raise
        print(f"database unreachable: {clean_error(failed)}", file=err)
    return EXIT_NO_DATABASE
