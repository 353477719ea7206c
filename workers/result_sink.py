"""Where the sweep driver hands results: a small protocol, plus a JSON-lines file sink.

`workers` knows no SQL; the service provides a database sink with the same three methods.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import threading
import uuid
from pathlib import Path
from typing import Protocol

from pydantic import ValidationError

from .grid import TrialSpec
from .result import FINAL_STATUSES, TrialResult
from .sweep_spec import SweepSpec


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


JSONL_HEADER_EVENT = "sweep"
"""`event` of a results file's first line: the sweep the file holds (see JsonLinesSink.create)."""


class JsonLinesError(ValueError):
    """A results file that cannot be read; str() names the file and line."""


@dataclasses.dataclass(frozen=True)
class JsonLinesFile:
    """What a results file holds: its header (None for a file written without one) and every
    `finished` record as (line number, TrialResult), in the order they were written."""

    path: Path
    header: dict | None
    results: list[tuple[int, TrialResult]]

    @property
    def spec(self) -> SweepSpec | None:
        return None if self.header is None else SweepSpec.model_validate(self.header["spec"])


class JsonLinesSink:
    """Append one JSON object per event to a file; resumable from the same file.

    A file made by `create` starts with a header line naming its sweep: {"event": "sweep",
    "uid", "name", "spec", "created_at"} (one file, one sweep; `gdn-sweep import` keys on the
    uid). Then {"event": "started", "key"} and {"event": "finished", "key", "status",
    "result": TrialResult} lines.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    @classmethod
    def create(cls, path: str | Path, spec: SweepSpec) -> JsonLinesSink:
        """A new file for a new sweep (FileExistsError if `path` exists), its header written."""
        sink = cls(path)
        header = {"event": JSONL_HEADER_EVENT, "uid": uuid.uuid4().hex, "name": spec.name,
                  "spec": spec.model_dump(mode="json"),
                  "created_at": dt.datetime.now(dt.UTC).isoformat()}
        with sink.path.open("x", encoding="utf-8") as f:
            f.write(json.dumps(header) + "\n")
        return sink

    def _append(self, record: dict) -> None:
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def finished_keys(self) -> set[str]:
        if not self.path.exists():
            return set()
        return {result.trial.key for _, result in read_jsonl(self.path).results
                if result.status != "cancelled"}

    def trial_started(self, trial: TrialSpec) -> None:
        self._append({"event": "started", "key": trial.key})

    def trial_finished(self, result: TrialResult) -> None:
        self._append({"event": "finished", "key": result.trial.key, "status": result.status,
                      "result": result.model_dump(mode="json")})


def read_text(path: str | Path, error: type[ValueError]) -> str:
    """A UTF-8 text file's content; `error` naming the path when it is missing, not text, or
    cannot be read (a results file here, a sweep file in the service)."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise error(f"{path}: not a text file (UTF-8)") from None
    except OSError as err:
        raise error(f"{path}: cannot read it ({err.strerror or err})") from None


def read_jsonl(path: str | Path) -> JsonLinesFile:
    """Read and check a results file; JsonLinesError (naming file:line) for anything wrong in
    it: not JSON, not an object, an unknown event, a header that is not the first line or
    holds no valid sweep, a result that is not a final TrialResult. A last line cut short
    (the writer died mid-line) is an error too: a file is read whole or not at all."""
    path = Path(path)
    lines = read_text(path, JsonLinesError).splitlines()
    header, results = None, []
    for number, line in enumerate(lines, 1):
        where = f"{path}:{number}"
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise JsonLinesError(f"{where}: not JSON ({err.msg})") from None
        event = record.get("event") if isinstance(record, dict) else None
        try:
            if event == JSONL_HEADER_EVENT:
                if number != 1:
                    raise JsonLinesError("a sweep header after the first line (two files "
                                         "concatenated?)")
                for field in ("uid", "name", "spec", "created_at"):
                    if not isinstance(record.get(field), str if field != "spec" else dict):
                        raise JsonLinesError(f"the sweep header has no valid {field!r}")
                SweepSpec.model_validate(record["spec"])
                dt.datetime.fromisoformat(record["created_at"])
                header = record
            elif event == "finished":
                result = TrialResult.model_validate(record.get("result"))
                if result.status not in FINAL_STATUSES:
                    raise JsonLinesError(f"status {result.status!r} is not a final one")
                results.append((number, result))
            elif event != "started":
                raise JsonLinesError(f"event {event!r} is none of {JSONL_HEADER_EVENT!r}, "
                                     f"'started', 'finished'")
        except JsonLinesError as err:
            raise JsonLinesError(f"{where}: {err}") from None
        except ValidationError as err:
            field = "spec" if event == JSONL_HEADER_EVENT else "result"
            detail = "; ".join(f"{'.'.join(map(str, (field, *e['loc'])))}: {e['msg']}"
                               for e in err.errors()[:3])
            raise JsonLinesError(f"{where}: not a valid {event} record: {detail}") from None
        except ValueError as err:  # fromisoformat's
            raise JsonLinesError(f"{where}: not a valid {event} record: {err}") from None
    return JsonLinesFile(path=path, header=header, results=results)
