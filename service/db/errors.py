"""Database errors: which are worth retrying (`is_transient`, `retry_transient`), and how to
store or log one without the SQL text and parameters SQLAlchemy's str() carries."""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, StatementError
from sqlalchemy.exc import TimeoutError as PoolTimeout

log = logging.getLogger(__name__)
RETRY_FIRST_S, RETRY_MAX_S = 0.1, 5.0
"""Backoff between tries of a database write: doubling from the first to the most."""


def is_transient(err: BaseException) -> bool:
    """A database error worth retrying: the server unreachable or restarting, the connection
    lost, a serialization failure or deadlock (SQLSTATE class 40: psycopg raises them as
    OperationalError), SQLite busy, the pool exhausted."""
    if isinstance(err, (OperationalError, InterfaceError, PoolTimeout)):
        return True
    return isinstance(err, DBAPIError) and err.connection_invalidated


_SQL_ECHO = re.compile(r"\[SQL:|\[parameters:|^LINE \d+:", re.MULTILINE)


def without_sql(text: str) -> str:
    """`text` up to the SQL a database error's str() carries: SQLAlchemy's `[SQL: …]` and
    `[parameters: …]`, PostgreSQL's `LINE 1: <statement>`."""
    match = _SQL_ECHO.search(text)
    return (text if match is None else text[:match.start()]).rstrip()


def clean_error(err: BaseException, *, limit: int = 500) -> str:
    """`Type: message` to store or log: a database error by its driver's first line (never the
    SQL text or parameters SQLAlchemy's str() carries), anything else by its message."""
    if isinstance(err, StatementError) and err.orig is not None:
        err = err.orig
        lines = str(err).strip().splitlines()
        message = lines[0] if lines else ""
    else:
        message = without_sql(str(err)).strip()
    text = f"{type(err).__name__}: {message}" if message else type(err).__name__
    return text if len(text) <= limit else text[:limit - 1] + "…"


def retry_transient(fn: Callable[[], object], *, what: str,
                    stop: threading.Event | None = None):
    """fn() until it returns, waiting with exponential backoff after each transient database
    error (logged with `what`); other errors, and the last one once `stop` is set, raise."""
    delay, tries = RETRY_FIRST_S, 0
    while True:
        try:
            value = fn()
        except Exception as err:
            if not is_transient(err) or (stop is not None and stop.is_set()):
                raise
            tries += 1
            log.warning("%s: %s; retry %d in %.1f s", what, clean_error(err), tries, delay)
            if stop is not None:
                stop.wait(delay)
            else:
                time.sleep(delay)
            delay = min(delay * 2, RETRY_MAX_S)
            continue
        if tries:
            log.info("%s: done after %d retries", what, tries)
        return value


