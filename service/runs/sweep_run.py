"""Running one sweep from the database: claim it, drive the workers' driver on its trial rows
(the one expansion of its grid, made when it was created), renew, finish.

Both the service's scheduler and `gdn-sweep run` go through here. A sweep has one runner at a
time (`sweeps.runner`, a per-process identity: `runner_identity`): the claim is an atomic
conditional UPDATE, the runner renews `heartbeat_at` every poll, and another runner may take a
`running` sweep over only when no runner holds it, its heartbeat is older than the lease (the
runner stopped renewing), or its runner names a process of this host that no longer exists (a
restarted service resumes its dead predecessor's sweeps at once). A live runner's sweep is
never taken, whatever its configured name. Cancel is a status: `cancelling`, set by the API
from any process, is noticed at the next poll and stops the driver.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import socket
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from service.db import crud
from service.db.errors import clean_error, is_transient, retry_transient, without_sql
from service.db.models import Sweep, Trial, utcnow
from service.runs.db_sink import DatabaseSink
from workers.grid import TrialSpec

log = logging.getLogger(__name__)
RUNNER_MAX = 128
"""sweeps.runner's width."""
_INITIAL_PID_NAMESPACE = "pid:[4026531836]"  # the kernel's fixed inode of the host's namespace


def _this_host() -> str:
    """The host name, plus the pid namespace when not the host's: containers that share a
    host name (host networking) do not see each other's pids."""
    host = socket.gethostname()
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return host
    return host if namespace == _INITIAL_PID_NAMESPACE else f"{host}+{namespace[5:-1]}"


_HOST = _this_host()
_RUNNER = re.compile(r"@(?P<host>[^@:]+):(?P<pid>\d+):(?P<start>\d+)$")


def process_start(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot; 0 where /proc is missing), or None
    if there is no such live process (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return 0
    fields = stat[stat.rindex(")") + 2:].split()  # the name in (…) may hold spaces
    return None if fields[0] in ("Z", "X") else int(fields[19])


def runner_identity(name: str) -> str:
    """`<name>@<host>:<pid>:<start>`: this process as a sweep's runner, unique even when
    services share a configured name; `name` is cut to fit sweeps.runner."""
    suffix = f"@{_HOST}:{os.getpid()}:{process_start(os.getpid()) or 0}"
    return name[:RUNNER_MAX - len(suffix)] + suffix


def runner_is_gone(runner: str) -> bool:
    """Whether `runner` names a process of this host that no longer runs (its pid gone, or
    reused by a process that started at another time)."""
    match = _RUNNER.search(runner)
    if match is None or match["host"] != _HOST:
        return False
    return process_start(int(match["pid"])) != int(match["start"])


def _gone_runners(session: Session) -> list[str]:
    held = session.scalars(select(Sweep.runner).distinct().where(
        Sweep.status.in_(("running", "cancelling")), Sweep.runner.like(f"%@{_HOST}:%")))
    return [runner for runner in held if runner_is_gone(runner)]


def _takeover(session: Session, lease_s: float):
    """A running/cancelling sweep no live runner holds."""
    stale = utcnow() - dt.timedelta(seconds=lease_s)
    return or_(Sweep.runner.is_(None), Sweep.heartbeat_at.is_(None), Sweep.heartbeat_at < stale,
               Sweep.runner.in_(_gone_runners(session)))


def next_sweep_id(*, session: Session, lease_s: float) -> int | None:
    """The oldest sweep a runner may take: queued, or running/cancelling with no live runner."""
    return session.scalar(select(Sweep.id).where(or_(
        Sweep.status == "queued",
        and_(Sweep.status.in_(("running", "cancelling")), _takeover(session, lease_s))))
        .order_by(Sweep.id).limit(1))


def claimable(*, session: Session, sweep_id: int, runner_id: str, lease_s: float) -> bool:
    """Whether `claim` would give `runner_id` the sweep to run (never one a live runner
    holds, this one included)."""
    return session.scalar(select(Sweep.id).where(Sweep.id == sweep_id, or_(
        Sweep.status == "queued",
        and_(Sweep.status == "running", _takeover(session, lease_s))))) is not None


def claim(*, session: Session, sweep_id: int, runner_id: str, lease_s: float) -> str | None:
    """Take the sweep: "running" (run it), "cancelling" (only close it), None (not ours).

    On a take-over, trials left `running` by the previous runner go back to `pending`: their
    runs died with it, and the driver runs every trial that has no final status.
    """
    now = utcnow()
    took = session.execute(update(Sweep).where(
        Sweep.id == sweep_id,
        or_(Sweep.status == "queued",
            and_(Sweep.status == "running", _takeover(session, lease_s)))).values(
        status="running", runner=runner_id, heartbeat_at=now,
        started_at=func.coalesce(Sweep.started_at, now))).rowcount
    if took:
        reset = session.execute(update(Trial).where(
            Trial.sweep_id == sweep_id, Trial.status == "running").values(
            status="pending", started_at=None)).rowcount
        session.commit()
        if reset:
            log.info("sweep %s: %d trial(s) were running under the previous runner; they run "
                     "again", sweep_id, reset)
        return "running"
    took = session.execute(update(Sweep).where(
        Sweep.id == sweep_id, Sweep.status == "cancelling", _takeover(session, lease_s))
        .values(runner=runner_id, heartbeat_at=now)).rowcount
    session.commit()
    return "cancelling" if took else None


def heartbeat(*, session: Session, sweep_id: int, runner_id: str) -> str | None:
    """Renew the claim; the sweep's status, or None if another runner has taken it over."""
    renewed = session.execute(update(Sweep).where(
        Sweep.id == sweep_id, Sweep.runner == runner_id).values(heartbeat_at=utcnow())).rowcount
    session.commit()
    if not renewed:
        return None
    return session.scalar(select(Sweep.status).where(Sweep.id == sweep_id))


def release(*, session: Session, sweep_id: int, runner_id: str) -> None:
    """Give the sweep up unfinished: any runner may take it over at once."""
    session.execute(update(Sweep).where(Sweep.id == sweep_id, Sweep.runner == runner_id)
                    .values(runner=None, heartbeat_at=None))
    session.commit()


def finish(*, session: Session, sweep_id: int, status: str, error: str | None = None,
           stop_event: threading.Event | None = None) -> bool:
    """End the sweep: close its open trials (with result rows), then set its final status.

    Retried while the database is unreachable; False if `stop_event` was set first (the
    sweep is left unfinished, to resume). `error` is stored without any SQL text in it."""
    trial_status, why = {
        "cancelled": ("cancelled", "sweep cancelled before this trial ended"),
        "failed": ("failed", error or "sweep failed"),
        "finished": ("failed", "the driver ended without reporting this trial"),
    }[status]
    error, why = (None if error is None else without_sql(error)), without_sql(why)

    def end() -> int:
        try:
            left = crud.close_unfinished(session=session, sweep_id=sweep_id,
                                         status=trial_status, error=why)
            values: dict = {"status": status, "finished_at": utcnow()}
            if error is not None:
                values["error"] = error
            session.execute(update(Sweep).where(Sweep.id == sweep_id).values(**values))
            session.commit()
            return left
        except Exception:
            session.rollback()
            raise

    try:
        left = retry_transient(end, what=f"sweep {sweep_id}: recording it {status}",
                               stop=stop_event)
    except Exception as err:
        if not (is_transient(err) and stop_event is not None and stop_event.is_set()):
            raise
        log.warning("sweep %s: stopping before it could be recorded %s (%s); it resumes on the "
                    "next start", sweep_id, status, clean_error(err))
        return False
    if left and status == "finished":
        log.warning("sweep %s: %d trial(s) had no result; marked failed", sweep_id, left)
    return True


def drive(*, session_factory: sessionmaker[Session], sweep_id: int, name: str,
          trials: Sequence[TrialSpec], sink: DatabaseSink, cancel_event: threading.Event,
          runner_id: str, max_concurrent_trials: int, poll_s: float,
          on_event: Callable[[object], None] | None = None,
          stop_event: threading.Event | None = None, driver_options=None) -> str | None:
    """Run the driver on the sweep's `trials` (its rows, crud.sweep_trials; `name` is the
    sweep's) in a thread until it returns and the sink has stored every result it was given
    (through a database outage: the sweep's end must not close trials whose results wait in
    the sink); meanwhile renew the claim every poll_s and turn a `cancelling` status into a
    cancel. Returns the driver's error, if it raised. A detached sink (a
    shutdown, a take-over) is not waited for. A KeyboardInterrupt detaches the sink, stops the
    driver, waits for it, then is raised again (the sweep is left to resume, as after a
    shutdown)."""
    from workers.driver import run_trials

    outcome: dict[str, str] = {}

    def target() -> None:
        try:
            run_trials(trials, sink, name=name, max_concurrent_trials=max_concurrent_trials,
                       on_event=on_event, cancel_event=cancel_event, options=driver_options)
        except BaseException as err:  # noqa: BLE001 - becomes the sweep's error
            if sink.detached:  # stopped (Ctrl-C, shutdown): Ray calls may raise on the way out
                log.info("sweep %s: driver stopped (%s)", sweep_id, clean_error(err))
            else:
                log.exception("sweep %s: driver failed", sweep_id)
            outcome["error"] = clean_error(err)

    thread = threading.Thread(target=target, name=f"gdn-sweep-{sweep_id}", daemon=True)
    thread.start()
    interrupted = draining = False
    failed_beats = 0
    while thread.is_alive() or not (sink.detached or sink.drained):
        try:
            if thread.is_alive():
                thread.join(poll_s)
            else:
                if not draining:
                    draining = True
                    log.info("sweep %s: the driver is done; waiting for its results to be "
                             "stored", sweep_id)
                sink.wait_drained(poll_s)
        except KeyboardInterrupt:  # Ctrl-C in `gdn-sweep run`: a stop, not a cancel
            if interrupted:
                raise
            interrupted = True
            sink.detach()  # unfinished trials stay unfinished: running the file again resumes
            cancel_event.set()
            log.warning("sweep %s: interrupted; stopping the running trials", sweep_id)
        if interrupted or (stop_event is not None and stop_event.is_set()):
            continue
        try:
            with session_factory() as session:
                status = heartbeat(session=session, sweep_id=sweep_id, runner_id=runner_id)
        except Exception as err:  # noqa: BLE001 - a database hiccup must not stop the trials
            failed_beats += 1
            if failed_beats == 1:  # once per outage, not every poll
                log.warning("sweep %s: heartbeat failed (%s); the trials go on, retrying every "
                            "%.1f s", sweep_id, clean_error(err), poll_s)
            continue
        if failed_beats:
            log.info("sweep %s: heartbeat renewed after %d failed tries", sweep_id, failed_beats)
            failed_beats = 0
        if status is None and not sink.detached:
            log.error("sweep %s: another runner took it over; stopping here", sweep_id)
            sink.detach()
            cancel_event.set()
        elif status == "cancelling" and not cancel_event.is_set():
            log.info("sweep %s: cancel requested", sweep_id)
            cancel_event.set()
    if interrupted:
        raise KeyboardInterrupt
    return outcome.get("error")
