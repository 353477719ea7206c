"""DatabaseSink: the workers' ResultSink protocol writing to the service database.

Writes are idempotent: a trial that already ran to an outcome keeps its result (the results
table's primary key, trial_id, backs this up), so a trial can never get two result rows,
whichever process or thread reports it; a cancelled trial that a resumed run retries has its
one row replaced. The trial's attempts (`trial_attempts`) and its environment (stored once per
distinct one, service/db/environments.py) are written in the same transaction as its result,
and kept or replaced with it. `detach()` makes the sink drop further reports: the
scheduler detaches before it stops a sweep for a shutdown, so the stopped trials stay
pending/running in the database and run again when a scheduler resumes the sweep.

The sink never raises into the driver. A result is appended to the spool first (fsynced, see
service/runs/spool.py), then written; a write the database refuses for a transient reason
(outage, lost connection, serialization failure; service/db/errors.py) is retried by a writer
thread with exponential backoff while the trials go on, and `wait_drained` lets the sweep's
end wait for it. If the process dies meanwhile, the spool file keeps the result:
`finished_keys` (and the scheduler at start) replays the files of dead processes first, so
those trials count as done and do not run again.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import random
import re
import threading
from collections.abc import Callable
from functools import partial

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from service.db.environments import environment_id
from service.db.errors import (
    RETRY_FIRST_S,
    RETRY_MAX_S,
    clean_error,
    is_transient,
    retry_transient,
)
from service.db.models import (
    METRIC_COLUMNS,
    PROFILE_COLUMNS,
    Result,
    Trial,
    TrialAttempt,
    result_for,
    trial_row,
    utcnow,
)
from service.runs.spool import Journal, Spool
from workers.grid import TrialSpec
from workers.result import FINAL_STATUSES, TrialResult

log = logging.getLogger(__name__)
RAN_TO_AN_OUTCOME = FINAL_STATUSES - {"cancelled"}
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
REFUSED_TRIES = 3
"""Tries of a write the database refuses for a reason other than an outage (then give up)."""


@dataclasses.dataclass
class _Write:
    what: str
    run: Callable[[], None]
    give_up: Callable[[BaseException], None] = lambda err: None
    result: bool = False
    tries: int = 0


class DatabaseSink:
    """Record one sweep's trial events in the database (thread-safe: a session per call).

    `spool`: where results wait for the database (default: GDN_SWEEP_SPOOL_DIR's directory
    for this database); None keeps them in memory only (lost if the process dies)."""

    def __init__(self, session_factory: sessionmaker[Session], sweep_id: int, *,
                 spool: Spool | None | str = "default") -> None:
        self._session_factory = session_factory
        self.sweep_id = sweep_id
        if spool == "default":
            from service.core.config import Settings

            spool = Spool(Settings().spool_dir, session_factory.kw["bind"].url)
        self._spool: Spool | None = spool
        self._journal: Journal | None = None if spool is None else spool.journal(sweep_id)
        self._detached = threading.Event()  # ends finished_keys' retries too
        self._closed = threading.Event()  # ends the writer's retries
        self._cond = threading.Condition()
        self._queue: collections.deque[_Write] = collections.deque()
        self._in_flight = 0
        self._writer: threading.Thread | None = None

    def detach(self) -> None:
        """Ignore every later event (the sweep is being stopped, not cancelled). Writes
        already accepted still go to the database."""
        self._detached.set()

    @property
    def detached(self) -> bool:
        return self._detached.is_set()

    def finished_keys(self) -> set[str]:
        """Trials with an outcome; cancelled ones are left out, so a resumed run retries them.
        Results spooled by dead processes are stored first; waits out a database outage."""
        def read() -> set[str]:
            if self._spool is not None:
                replay_spool(self._spool, self._session_factory)
            with self._session_factory() as session:
                return set(session.scalars(select(Trial.key).where(
                    Trial.sweep_id == self.sweep_id, Trial.status.in_(RAN_TO_AN_OUTCOME))))

        return retry_transient(read, what=f"sweep {self.sweep_id}: reading its finished trials",
                               stop=self._detached)

    def trial_started(self, trial: TrialSpec) -> None:
        if self.detached:
            return
        log.info("sweep %s: %s started", self.sweep_id, trial.key)
        self._submit(_Write(f"start of {trial.key}",
                            partial(self._mark_started, trial.key, utcnow())))

    def trial_finished(self, result: TrialResult) -> None:
        if self.detached:
            return
        seq = self._spool_append(result)
        self._submit(_Write(f"result of {result.trial.key}", partial(self._store, result, seq),
                            give_up=partial(self._store_refused, result, seq), result=True))

    @property
    def drained(self) -> bool:
        """Every accepted event is in the database."""
        with self._cond:
            return not self._queue and not self._in_flight

    def wait_drained(self, timeout_s: float | None = None) -> bool:
        """Wait until every accepted event is in the database; False after timeout_s."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._in_flight,
                                       timeout_s)

    def close(self, timeout_s: float = 0.0) -> bool:
        """Detach, give pending writes up to timeout_s, then stop retrying them: what is not
        written stays in the spool file for the next start. True if everything was written."""
        self.detach()
        drained = self.wait_drained(timeout_s)
        self._closed.set()
        if self._journal is not None:
            self._journal.close()
        if not drained:
            log.warning("sweep %s: %d write(s) not done at close; results wait in %s",
                        self.sweep_id, len(self._queue),
                        self._spool.directory if self._spool else "memory (lost)")
        return drained

    # -- the writes ------------------------------------------------------------------------

    def _mark_started(self, key: str, at) -> None:
        with self._session_factory() as session:
            session.execute(update(Trial).where(
                Trial.sweep_id == self.sweep_id, Trial.key == key,
                Trial.status.not_in(FINAL_STATUSES)).values(status="running", started_at=at))
            session.commit()

    def _store(self, result: TrialResult, seq: int | None) -> None:
        if not record_result(session_factory=self._session_factory, sweep_id=self.sweep_id,
                             result=result):
            log.info("sweep %s: %s already has a result; kept the first", self.sweep_id,
                     result.trial.key)
        if seq is not None:
            self._journal.mark_stored(seq)

    def _store_refused(self, result: TrialResult, seq: int | None, err: BaseException) -> None:
        """The database refuses this result for good (not an outage): record the trial failed,
        saying why, rather than leave it to be closed as never reported."""
        self._store(result.model_copy(update={
            "status": "failed", "metrics": type(result.metrics)(),
            "error": f"its {result.status} result could not be stored: {clean_error(err)}"}),
            seq)

    def _spool_append(self, result: TrialResult) -> int | None:
        if self._journal is None:
            return None
        try:
            return self._journal.append(result)
        except OSError as err:
            log.error("sweep %s: cannot spool the result of %s to %s (%s); it waits in memory "
                      "only", self.sweep_id, result.trial.key, self._spool.directory, err)
            return None

    def _submit(self, write: _Write) -> None:
        """Write now unless earlier writes wait (then it queues behind them); a failed write
        goes to the writer thread."""
        with self._cond:
            now = not self._queue and self._writer is None
            if now:
                self._in_flight += 1
        if now:
            try:
                write.run()
                return
            except Exception as err:  # noqa: BLE001 - never into the driver
                write.tries = 1
                log.warning("sweep %s: %s not written (%s); retrying in the background%s",
                            self.sweep_id, write.what, clean_error(err), self._where())
            finally:
                with self._cond:
                    self._in_flight -= 1
                    self._cond.notify_all()
        elif write.result:
            log.warning("sweep %s: %s waits behind %d earlier write(s)%s", self.sweep_id,
                        write.what, len(self._queue), self._where())
        with self._cond:
            self._queue.append(write)
            if self._writer is None:
                self._writer = threading.Thread(target=self._write_queued, daemon=True,
                                                name=f"gdn-sweep-sink-{self.sweep_id}")
                self._writer.start()

    def _write_queued(self) -> None:
        delay = RETRY_FIRST_S
        while True:
            with self._cond:
                if not self._queue or self._closed.is_set():
                    self._writer = None
                    self._cond.notify_all()
                    return
                write = self._queue[0]
                self._in_flight += 1
            try:
                write.run()
                if write.tries:
                    log.info("sweep %s: %s written after %d failed tries", self.sweep_id,
                             write.what, write.tries)
            except Exception as err:  # noqa: BLE001 - logged; retried or given up
                write.tries += 1
                if is_transient(err) or write.tries < REFUSED_TRIES:
                    log.warning("sweep %s: %s not written (%s); try %d in %.1f s%s",
                                self.sweep_id, write.what, clean_error(err), write.tries + 1,
                                delay, self._where())
                    with self._cond:
                        self._in_flight -= 1
                    self._closed.wait(delay * random.uniform(0.8, 1.2))
                    delay = min(delay * 2, RETRY_MAX_S)
                    continue
                log.error("sweep %s: the database refuses the %s: %s", self.sweep_id,
                          write.what, clean_error(err))
                try:
                    write.give_up(err)
                except Exception as again:  # noqa: BLE001 - it stays in the spool
                    log.error("sweep %s: %s: %s; left in the spool", self.sweep_id, write.what,
                              clean_error(again))
            with self._cond:
                self._in_flight -= 1
                self._queue.popleft()
                self._cond.notify_all()
            delay = RETRY_FIRST_S

    def _where(self) -> str:
        path = None if self._journal is None else self._journal.path
        return f" (spooled in {path})" if path else ""


def replay_spool(spool: Spool, session_factory: sessionmaker[Session]) -> int:
    """Store the results dead processes left in `spool` (see Spool.replay); how many."""
    return spool.replay(lambda sweep_id, result: record_result(
        session_factory=session_factory, sweep_id=sweep_id, result=result), is_transient)


def record_result(*, session_factory: sessionmaker[Session], sweep_id: int,
                  result: TrialResult) -> bool:
    """Store `result` as the trial's one result; False if the trial already had one."""
    if result.status not in FINAL_STATUSES:
        raise ValueError(f"result.status={result.status!r} is not final; a result needs one of: "
                         f"{', '.join(sorted(FINAL_STATUSES))}")
    with session_factory() as session:
        try:
            return _record(session, sweep_id, result)
        except IntegrityError:  # another writer stored it first: the primary key keeps that one
            session.rollback()
            return False


def _record(session: Session, sweep_id: int, result: TrialResult) -> bool:
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
        environment_id=(None if result.environment is None else
                        environment_id(session=session, body=result.environment)),
        **{name: metrics.get(name) for name in METRIC_COLUMNS}, **_profile_values(result))
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
    session.commit()
    return True


def _profile_values(result: TrialResult) -> dict:
    """The PROFILE_COLUMNS of a result (all None when the trial was not profiled)."""
    profile = result.profile
    if profile is None:
        return dict.fromkeys(PROFILE_COLUMNS)
    return dict(profile_format=profile.format, profile_path=profile.path,
                profile_bytes=profile.bytes, profile_summary=profile.summary,
                profile_error=_plain(profile.error), profile_status=profile.status)


def _plain(text: str | None) -> str | None:
    """Errors as plain text: Ray colours tracebacks with terminal escape codes."""
    return None if text is None else _ANSI.sub("", text)
