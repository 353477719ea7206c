"""Where the sweep driver hands results: a small protocol, plus a JSON-lines file sink.

`workers` knows no SQL; the service provides a database sink with the same three methods.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Protocol

from .result import FINAL_STATUSES, TrialResult
from .spec import TrialSpec


class ResultSink(Protocol):
    def finished_keys(self) -> set[str]:
        """Keys (TrialSpec.key) of trials that already ended; the driver runs only the rest.

        A cancelled trial never ran to an outcome: leave it out so a resumed sweep runs it.
        """

    def trial_started(self, trial: TrialSpec) -> None:
        """A trial is about to run (its chips are being placed); not called for trials that
        end skipped or cancelled without running."""

    def trial_finished(self, result: TrialResult) -> None:
        """A trial ended with any final status; called exactly once per trial run."""


class JsonLinesSink:
    """Append one JSON object per event to a file; resumable from the same file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def _append(self, record: dict) -> None:
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def finished_keys(self) -> set[str]:
        if not self.path.exists():
            return set()
        keys = set()
        for line in self.path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if (record.get("event") == "finished" and record["status"] in FINAL_STATUSES
                    and record["status"] != "cancelled"):
                keys.add(TrialSpec.model_validate(record["result"]["trial"]).key)
        return keys

    def trial_started(self, trial: TrialSpec) -> None:
        self._append({"event": "started", "key": trial.key})

    def trial_finished(self, result: TrialResult) -> None:
        self._append({"event": "finished", "key": result.trial.key, "status": result.status,
                      "result": result.model_dump(mode="json")})
