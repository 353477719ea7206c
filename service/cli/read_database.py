"""The database a read command opens (`results`, `regressions`, `schedule list|show|…`).

Without `--db` or DATABASE_URL the service's default is `sqlite:///gdn_sweep.db`, a file in
the current folder: run anywhere but the checkout that holds it, a read command would create an
empty database there and report nothing. So a read command says which database it opened when
it was not told, and refuses a SQLite file that does not exist, naming the path it looked for
and how to point it elsewhere, creating nothing. The commands that create a database on purpose
(`serve`, `run --db`, `import`, `db upgrade`, `schedule add`, the demo) do not come here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

EXIT_NO_DATABASE = 1
"""As for a database that cannot be reached (regressions.py, schedule.py)."""


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
