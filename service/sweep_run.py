"""Running one sweep from the database: claim it, drive the workers' driver, renew, finish.

Both the service's scheduler and `gdn-sweep run` go through here. A sweep has one runner at a
time (`sweeps.runner`): the claim is an atomic conditional UPDATE, the runner renews
`heartbeat_at` every poll, and another runner may take a `running` sweep over only when it is
its own (same runner id: the service restarted) or the heartbeat is older than the lease (the
runner died). Cancel is a status: `cancelling`, set by the API from any process, is noticed at
the next poll and stops the driver.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
from collections.abc import Callable

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from workers.spec import SweepSpec

from . import crud
from .models import Sweep, Trial, utcnow
from .sink import DatabaseSink

log = logging.getLogger(__name__)


def _takeover(runner_id: str, lease_s: float):
    stale = utcnow() - dt.timedelta(seconds=lease_s)
    return or_(Sweep.runner.is_(None), Sweep.runner == runner_id, Sweep.heartbeat_at.is_(None),
               Sweep.heartbeat_at < stale)


def next_sweep_id(*, session: Session, runner_id: str, lease_s: float) -> int | None:
    """The oldest sweep this runner may take: queued, or running/cancelling with no live runner."""
    return session.scalar(select(Sweep.id).where(or_(
        Sweep.status == "queued",
        and_(Sweep.status.in_(("running", "cancelling")), _takeover(runner_id, lease_s))))
        .order_by(Sweep.id).limit(1))


def claimable(*, session: Session, sweep_id: int, runner_id: str, lease_s: float) -> bool:
    """Whether `claim` would give this runner the sweep to run."""
    return session.scalar(select(Sweep.id).where(Sweep.id == sweep_id, or_(
        Sweep.status == "queued",
        and_(Sweep.status == "running", _takeover(runner_id, lease_s))))) is not None


def claim(*, session: Session, sweep_id: int, runner_id: str, lease_s: float) -> str | None:
    """Take the sweep: "running" (run it), "cancelling" (only close it), None (not ours).

    On a take-over, trials left `running` by the previous runner go back to `pending`: their
    runs died with it, and the driver runs every trial that has no final status.
    """
    now = utcnow()
    took = session.execute(update(Sweep).where(
        Sweep.id == sweep_id,
        or_(Sweep.status == "queued",
            and_(Sweep.status == "running", _takeover(runner_id, lease_s)))).values(
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
        Sweep.id == sweep_id, Sweep.status == "cancelling", _takeover(runner_id, lease_s))
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


def finish(*, session: Session, sweep_id: int, status: str, error: str | None = None) -> None:
    """End the sweep: close its open trials (with result rows), then set its final status."""
    trial_status, why = {
        "cancelled": ("cancelled", "sweep cancelled before this trial ended"),
        "failed": ("failed", error or "sweep failed"),
        "finished": ("failed", "the driver ended without reporting this trial"),
    }[status]
    left = crud.close_unfinished(session=session, sweep_id=sweep_id, status=trial_status,
                                 error=why)
    if left and status == "finished":
        log.warning("sweep %s: %d trial(s) had no result; marked failed", sweep_id, left)
    values: dict = {"status": status, "finished_at": utcnow()}
    if error is not None:
        values["error"] = error
    session.execute(update(Sweep).where(Sweep.id == sweep_id).values(**values))
    session.commit()


def drive(*, session_factory: sessionmaker[Session], sweep_id: int, spec: SweepSpec,
          sink: DatabaseSink, cancel_event: threading.Event, runner_id: str,
          max_concurrent_trials: int, poll_s: float,
          on_event: Callable[[object], None] | None = None,
          stop_event: threading.Event | None = None, driver_options=None) -> str | None:
    """Run the driver in a thread until it returns; meanwhile renew the claim every poll_s
    and turn a `cancelling` status into a cancel. Returns the driver's error, if it raised.
    A KeyboardInterrupt detaches the sink, stops the driver, waits for it, then is raised
    again (the sweep is left to resume, as after a shutdown)."""
    from workers.driver import run_sweep

    outcome: dict[str, str] = {}

    def target() -> None:
        try:
            run_sweep(spec, sink, max_concurrent_trials=max_concurrent_trials,
                      on_event=on_event, cancel_event=cancel_event, options=driver_options)
        except BaseException as err:  # noqa: BLE001 - becomes the sweep's error
            log.exception("sweep %s: driver failed", sweep_id)
            outcome["error"] = f"{type(err).__name__}: {err}"

    thread = threading.Thread(target=target, name=f"gdn-sweep-{sweep_id}", daemon=True)
    thread.start()
    interrupted = False
    while thread.is_alive():
        try:
            thread.join(poll_s)
        except KeyboardInterrupt:  # Ctrl-C in `gdn-sweep run`: a stop, not a cancel
            if interrupted:
                raise
            interrupted = True
            sink.detach()  # unfinished trials stay unfinished: running the file again resumes
            cancel_event.set()
            log.warning("sweep %s: interrupted; stopping the running trials", sweep_id)
        if cancel_event.is_set() or (stop_event is not None and stop_event.is_set()):
            continue
        try:
            with session_factory() as session:
                status = heartbeat(session=session, sweep_id=sweep_id, runner_id=runner_id)
        except Exception:  # noqa: BLE001 - a database hiccup must not stop the trials
            log.exception("sweep %s: heartbeat failed; retrying", sweep_id)
            continue
        if status is None:
            log.error("sweep %s: another runner took it over; stopping here", sweep_id)
            sink.detach()
            cancel_event.set()
        elif status == "cancelling":
            log.info("sweep %s: cancel requested", sweep_id)
            cancel_event.set()
    if interrupted:
        raise KeyboardInterrupt
    return outcome.get("error")
