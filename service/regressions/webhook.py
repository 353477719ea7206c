"""A schedule's webhook: when one of its sweeps finishes and opens new regressions, one POST
of a JSON summary, off the sweep's path.

`alert_in_background` starts a daemon thread and returns at once: the sweep is finished and
the scheduler goes on whatever the webhook does. The thread finds the new regressions
(alerts.py), claims them, POSTs once — to a destination the service's WebhookPolicy allows
(destinations.py: no internal address when the service serves beyond loopback) — with retries (TRIES, doubling backoff, a timeout per
try), and stores the outcome on the alerts and the schedule (GET /api/schedules/{id},
the schedules page); a failure is logged, never raised. Each request carries an
`Idempotency-Key` naming the schedule and sweep, so a receiver can drop the duplicate that a
lost response followed by a retry can cause.

The retry loop is hand-written (a dozen lines over httpx): httpx's transport retries only
failed connections, not 5xx answers, and a retry library (tenacity) would be a dependency
for one loop.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import httpx
from sqlalchemy.orm import Session, sessionmaker

from service.core.config import get_settings
from service.db.errors import clean_error
from service.db.models import Sweep
from service.regressions.alerts import claim_alerts, new_regressions, record_delivery
from service.regressions.destinations import DestinationRefused, WebhookPolicy, pinned_request

log = logging.getLogger(__name__)
TRIES = 4
BACKOFF_S = 2.0
"""Wait before the second try; doubled before each later one."""
TIMEOUT_S = 10.0
"""Per try: connecting, sending and the answer together."""


def post_json(url: str, body: dict[str, Any], *, policy: WebhookPolicy,
              headers: dict[str, str] | None = None, tries: int = TRIES,
              backoff_s: float = BACKOFF_S, timeout_s: float = TIMEOUT_S
              ) -> tuple[str | None, int]:
    """POST `body` until a 2xx answer; (None, tries used) on success, else (the last
    error, tries used). A 4xx other than 408/429 is not retried: the receiver refuses it;
    nor is a destination `policy` refuses (its host is resolved again at every try)."""
    error = None
    for attempt in range(1, tries + 1):
        try:
            target, host_header, extensions = pinned_request(url, policy)
            with httpx.Client(timeout=timeout_s, follow_redirects=False) as client:
                answer = client.post(target, json=body, extensions=extensions,
                                     headers={**(headers or {}), **host_header})
            if answer.is_success:
                return None, attempt
            error = f"HTTP {answer.status_code} from {url}: {answer.text[:200]}"
            if answer.is_client_error and answer.status_code not in (408, 429):
                return error, attempt
        except DestinationRefused as err:
            return str(err), attempt
        except (httpx.HTTPError, OSError) as err:  # OSError: the name did not resolve
            error = f"{type(err).__name__} posting to {url}: {err}"
        if attempt < tries:
            time.sleep(backoff_s * 2 ** (attempt - 1))
    return error, tries


def alert_after_sweep(*, session_factory: sessionmaker[Session], sweep_id: int,
                      policy: WebhookPolicy | None = None, tries: int = TRIES,
                      backoff_s: float = BACKOFF_S, timeout_s: float = TIMEOUT_S) -> int:
    """Send the webhook of the schedule that created `sweep_id` the regressions the sweep
    opened (those not sent before); how many were sent. Never raises. `policy`: where a
    webhook may go (default: this process's settings)."""
    try:
        policy = policy or WebhookPolicy.from_settings(get_settings())
        with session_factory() as session:
            schedule, found = new_regressions(session=session, sweep_id=sweep_id)
            if schedule is None or schedule.webhook_url is None or not found:
                return 0
            url, schedule_id, name = schedule.webhook_url, schedule.id, schedule.name
            claimed = claim_alerts(session=session, schedule_id=schedule_id,
                                   sweep_id=sweep_id, regressions=found)
            sweep_name = session.get(Sweep, sweep_id).name
        if not claimed:
            return 0
        body = {"event": "regressions_opened",
                "schedule": {"id": schedule_id, "name": name},
                "sweep": {"id": sweep_id, "name": sweep_name},
                "count": len(claimed),
                "regressions": [s.model_dump(mode="json", exclude={"points"})
                                for _, s in claimed]}
        error, attempts = post_json(
            url, body, policy=policy, tries=tries, backoff_s=backoff_s, timeout_s=timeout_s,
            headers={"Idempotency-Key": f"gdn-sweep-regressions-{schedule_id}-{sweep_id}"})
        with session_factory() as session:
            record_delivery(session=session, schedule_id=schedule_id,
                            alert_ids=[i for i, _ in claimed], error=error, attempts=attempts)
    except Exception as err:  # noqa: BLE001 - an alert must never reach the sweep
        log.exception("sweep %s: regression alert failed (%s)", sweep_id, clean_error(err))
        return 0
    if error is not None:
        log.warning("schedule %s: webhook failed after %d tries: %s", schedule_id, attempts,
                    error, extra={"event": "webhook_failed", "schedule_id": schedule_id,
                                  "sweep_id": sweep_id})
        return 0
    log.info("schedule %s: %d new regression(s) of sweep %s sent to its webhook", schedule_id,
             len(claimed), sweep_id, extra={"event": "webhook_delivered",
                                            "schedule_id": schedule_id, "sweep_id": sweep_id})
    return len(claimed)


def alert_in_background(*, session_factory: sessionmaker[Session], sweep_id: int,
                        **options) -> threading.Thread:
    """`alert_after_sweep` in a daemon thread (started; returned so tests can join it)."""
    thread = threading.Thread(target=alert_after_sweep, name=f"gdn-sweep-alert-{sweep_id}",
                              kwargs={"session_factory": session_factory,
                                      "sweep_id": sweep_id, **options}, daemon=True)
    thread.start()
    return thread

