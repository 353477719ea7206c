"""DatabaseSink: the workers' ResultSink protocol writing to the service database.

Writes are idempotent: a trial that already ran to an outcome keeps its result (the results
table's primary key, trial_id, backs this up), so a trial can never get two result rows,
whichever process or thread reports it; a cancelled trial that a resumed run retries has its
one row replaced. The trial's attempts (`trial_attempts`) are written in the same transaction
as its result, and kept or replaced with it. `detach()` makes the sink drop further reports: the
scheduler detaches before it stops a sweep for a shutdown, so the stopped trials stay
pending/running in the database and run again when a scheduler resumes the sweep.
"""

from __future__ import annotations

import logging
import re

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from workers.result import FINAL_STATUSES, TrialResult
from workers.spec import TrialSpec

from .models import METRIC_COLUMNS, Result, Trial, TrialAttempt, result_for, trial_row, utcnow

log = logging.getLogger(__name__)
RAN_TO_AN_OUTCOME = FINAL_STATUSES - {"cancelled"}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class DatabaseSink:
    """Record one sweep's trial events in the database (thread-safe: a session per call)."""

    def __init__(self, session_factory: sessionmaker[Session], sweep_id: int) -> None:
        self._session_factory = session_factory
        self.sweep_id = sweep_id
        self._detached = False

    def detach(self) -> None:
        """Ignore every later event (the sweep is being stopped, not cancelled)."""
        self._detached = True

    @property
    def detached(self) -> bool:
        return self._detached

    def finished_keys(self) -> set[str]:
        """Trials with an outcome; cancelled ones are left out, so a resumed run retries them."""
        with self._session_factory() as session:
            return set(session.scalars(select(Trial.key).where(
                Trial.sweep_id == self.sweep_id, Trial.status.in_(RAN_TO_AN_OUTCOME))))

    def trial_started(self, trial: TrialSpec) -> None:
        if self._detached:
            return
        with self._session_factory() as session:
            session.execute(update(Trial).where(
                Trial.sweep_id == self.sweep_id, Trial.key == trial.key,
                Trial.status.not_in(FINAL_STATUSES)).values(status="running",
                                                            started_at=utcnow()))
            session.commit()

    def trial_finished(self, result: TrialResult) -> None:
        if self._detached:
            return
        if not record_result(session_factory=self._session_factory, sweep_id=self.sweep_id,
                             result=result):
            log.info("sweep %s: %s already has a result; kept the first", self.sweep_id,
                     result.trial.key)


def record_result(*, session_factory: sessionmaker[Session], sweep_id: int,
                  result: TrialResult) -> bool:
    """Store `result` as the trial's one result; False if the trial already had one."""
    if result.status not in FINAL_STATUSES:
        raise ValueError(f"result.status={result.status!r} is not final; a result needs one of: "
                         f"{', '.join(sorted(FINAL_STATUSES))}")
    with session_factory() as session:
        trial = session.scalars(select(Trial).where(
            Trial.sweep_id == sweep_id, Trial.key == result.trial.key).with_for_update()).first()
        if trial is None:
            trial = trial_row(sweep_id=sweep_id, spec=result.trial, status="pending",
                              created_at=utcnow())
            session.add(trial)
            session.flush()
        if trial.status in RAN_TO_AN_OUTCOME:
            return False
        metrics = result.metrics.model_dump()
        values = dict(
            status=result.status,
            error=_plain(result.error if result.error is not None else result.trial.skip_reason),
            attempts=result.attempts, hosts=list(result.hosts), versions=dict(result.versions),
            started_at=result.started_at or trial.started_at,
            finished_at=result.finished_at or utcnow(),
            **{name: metrics.get(name) for name in METRIC_COLUMNS})
        if trial.status == "cancelled":  # a resumed run retried it: its one row is replaced
            session.execute(update(Result).where(Result.trial_id == trial.id).values(**values))
            session.execute(delete(TrialAttempt).where(TrialAttempt.trial_id == trial.id))
        else:
            session.add(result_for(trial, **values))
        session.add_all(TrialAttempt(trial_id=trial.id, attempt=a.attempt, status=a.status,
                                     reason=_plain(a.reason), hosts=list(a.hosts),
                                     started_at=a.started_at, finished_at=a.finished_at)
                        for a in result.attempt_history)
        trial.status = result.status
        try:
            session.commit()
        except IntegrityError:
            session.rollback()
            return False
        return True


def _plain(text: str | None) -> str | None:
    """Errors as plain text: Ray colours tracebacks with terminal escape codes."""
    return None if text is None else _ANSI.sub("", text)


def open_database_sink(database_url: str, spec) -> DatabaseSink:
    """The sink `gdn-sweep run SWEEP --db URL` uses when wired through the workers' run command
    (service/cli.py): see `foreground.open_cli_sink`."""
    from .foreground import open_cli_sink

    return open_cli_sink(database_url, spec)
