"""`gdn-sweep import FILE... --db URL`: results files written on a cluster (`--jsonl`) into the
database, as the rows a `--db` run would have written.

A file's header names its sweep by a uid; the sweep is created with the idempotency key
`jsonl:<uid>` (the API's idempotency_keys table: the key is the primary key, so two imports of
one file at once create one sweep), its trial rows by `crud.create_sweep` from the expansion
that checked the file, each result and its attempts by the sink's `record_result`, in file
order. So a result a trial already has is
kept, and a cancelled one is replaced by a later outcome: importing a file again adds nothing,
and a file that grew (its run was resumed) adds only what it gained. Trials the file has no
outcome for (the run was interrupted) are closed `cancelled`, so no scheduler runs them on
another cluster; a later import of the grown file replaces them.

Every file is read and checked before anything is written: a bad one is one line naming
file:line, exit code 2, nothing written.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
from pathlib import Path
from typing import TextIO

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from service.db import crud
from service.db.models import Result, Sweep, Trial
from service.runs.db_sink import record_result
from service.runs.preflight import EXIT_BAD_INPUT, EXIT_OK, database_error
from workers.result_sink import JsonLinesError, JsonLinesFile, read_jsonl
from workers.grid import TrialSpec, expand_trials
from workers.sweep_spec import SweepSpec

IDEMPOTENCY_PREFIX = "jsonl:"


class ImportFileError(ValueError):
    """A file that cannot be imported; str() is the one-line reason (file:line)."""


@dataclasses.dataclass(frozen=True)
class CheckedFile:
    """A results file read and checked, with its sweep's one expansion."""

    held: JsonLinesFile
    spec: SweepSpec
    trials: list[TrialSpec]
    """expand_trials(spec): every result of the file is one of them; the sweep's rows."""


@dataclasses.dataclass(frozen=True)
class ImportedFile:
    path: Path
    sweep_id: int
    created: bool
    """True when this import created the sweep (False: it was imported before)."""
    added: int
    """Results this import stored (0 for a file imported before and unchanged)."""
    trials: int


def check_file(path: str | Path) -> CheckedFile:
    """The file read and checked: a header, and every result a point of its sweep."""
    held = read_jsonl(path)
    if held.header is None:
        raise ImportFileError(f"{path}:1: no sweep header (written by an older gdn-sweep, or "
                              f"not a results file); it cannot be imported")
    spec = held.spec
    trials = expand_trials(spec)
    keys = {t.key for t in trials}
    for line, result in held.results:
        if result.trial.key not in keys:
            raise ImportFileError(f"{path}:{line}: trial {result.trial.key!r} is not a point "
                                  f"of sweep {spec.name!r} (its header's spec)")
    return CheckedFile(held, spec, trials)


def import_files(paths: list[str | Path], *,
                 session_factory: sessionmaker[Session]) -> list[ImportedFile]:
    """Import every file (all checked first: ImportFileError / JsonLinesError, nothing written)."""
    return import_checked([check_file(path) for path in paths], session_factory=session_factory)


def import_checked(checked: list[CheckedFile], *,
                   session_factory: sessionmaker[Session]) -> list[ImportedFile]:
    with session_factory() as session:
        for file in checked:  # a uid already imported with another spec: refuse first
            known = crud.get_idempotency_key(session=session, key=_key(file.held))
            if known is not None and known.request_hash != crud.spec_hash(file.spec):
                raise ImportFileError(f"{file.held.path}:1: sweep uid {file.held.header['uid']} "
                                      f"was imported before (sweep {known.sweep_id}) with "
                                      f"another spec")
    return [_import(file, session_factory) for file in checked]


def _key(held: JsonLinesFile) -> str:
    return IDEMPOTENCY_PREFIX + held.header["uid"]


def _import(file: CheckedFile, session_factory: sessionmaker[Session]) -> ImportedFile:
    held, created = file.held, False
    with session_factory() as session:
        known = crud.get_idempotency_key(session=session, key=_key(held))
        if known is None:
            try:
                sweep = crud.create_sweep(session=session, sweep_create=file.spec,
                                          idempotency_key=_key(held), trials=file.trials)
                sweep.created_at = dt.datetime.fromisoformat(held.header["created_at"])
                session.commit()
                sweep_id, created = sweep.id, True
            except IntegrityError:  # another import of this file committed it first
                session.rollback()
                known = crud.get_idempotency_key(session=session, key=_key(held))
        if known is not None:
            sweep_id = known.sweep_id
    added, started = 0, []
    for _, result in held.results:
        if record_result(session_factory=session_factory, sweep_id=sweep_id, result=result):
            added += 1
            started.append((result.trial.key, result.started_at))
    with session_factory() as session:
        for key, at in started:  # what the sink's trial_started wrote when it ran
            session.execute(update(Trial).where(Trial.sweep_id == sweep_id, Trial.key == key,
                                                Trial.status != "skipped")
                            .values(started_at=at))
        _close(session, sweep_id, held)
        trials = session.scalar(select(func.count()).select_from(Trial)
                                .where(Trial.sweep_id == sweep_id))
    return ImportedFile(path=held.path, sweep_id=sweep_id, created=created, added=added,
                        trials=trials)


def _close(session: Session, sweep_id: int, held: JsonLinesFile) -> None:
    """The sweep as its run left it: trials without an outcome closed `cancelled`; the sweep
    `finished` when no trial is cancelled, else `cancelled`; its times from its results."""
    crud.close_unfinished(session=session, sweep_id=sweep_id, status="cancelled",
                          error=f"no outcome in {held.path.name} (its run was interrupted); "
                                f"import the file again once the run is resumed")
    cancelled = session.scalar(select(func.count()).select_from(Trial).where(
        Trial.sweep_id == sweep_id, Trial.status == "cancelled")) or 0
    started, finished = session.execute(
        select(func.min(Result.started_at), func.max(Result.finished_at))
        .join(Trial, Trial.id == Result.trial_id).where(Trial.sweep_id == sweep_id)).one()
    session.execute(update(Sweep).where(Sweep.id == sweep_id).values(
        status="cancelled" if cancelled else "finished", runner=None, heartbeat_at=None,
        started_at=started, finished_at=finished,
        error=f"{cancelled} trial(s) without an outcome in {held.path.name}" if cancelled
        else None))
    session.commit()


def import_command(paths: list[str], *, database_url: str | None = None,
                   out: TextIO | None = None) -> int:
    """The CLI: every file checked, then the database reached, then written; exit 0, 2 (a
    bad file, or a bad database URL: nothing written) or 1 (the database cannot be reached)."""
    from service.core.config import Settings
    from service.db.engine import make_engine, make_session_factory

    out = out or sys.stdout
    try:
        checked = [check_file(path) for path in paths]
    except (ImportFileError, JsonLinesError) as err:
        print(err, file=sys.stderr)
        return EXIT_BAD_INPUT
    url = Settings(**({} if database_url is None else {"database_url": database_url})) \
        .database_url
    failed = database_error(url)
    if failed is not None:
        print(failed[1], file=sys.stderr)
        return failed[0]
    engine = make_engine(url)
    try:
        imported = import_checked(checked, session_factory=make_session_factory(engine))
    except ImportFileError as err:
        print(err, file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        engine.dispose()
    for done in imported:
        what = "new sweep" if done.created else "sweep"
        print(f"{done.path}: {what} {done.sweep_id}, {done.added} result(s) added, "
              f"{done.trials} trial(s)", file=out)
    return EXIT_OK
