"""The result spool: trial results written to a local file before the database, so a result
the database cannot take yet (an outage, a serialization failure) survives a crash.

Layout: `<spool_dir>/<database tag>/<host>-<pid>-sweep<id>-<random>.jsonl`, one directory per
database (the tag hashes its URL, password left out), one file per sink while it has results
not yet stored. Each line is one JSON object:

    {"v": 1, "op": "result", "seq": 3, "sweep_id": 7, "result": {...TrialResult...}}
    {"v": 1, "op": "stored", "seq": 3}

A "result" line is fsynced before the sink tries the database; "stored" follows once the
database has it. The writing process holds an exclusive flock on its file (the kernel drops it
when the process dies, SIGKILL included), so a file nobody locks belongs to a dead writer:
`Spool.replay` stores its unstored results and deletes it. A file whose results the database
refuses for good (not an outage) is renamed `*.unstored` and left for an operator.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.engine import URL, make_url

from workers.result import TrialResult

log = logging.getLogger(__name__)
VERSION = 1


def database_tag(database_url: str | URL) -> str:
    """A directory name for one database (its URL without the password, hashed)."""
    shown = make_url(database_url).render_as_string(hide_password=True)
    return hashlib.sha256(shown.encode()).hexdigest()[:16]


class Spool:
    """The spool directory of one database."""

    def __init__(self, spool_dir: str | Path, database_url: str | URL) -> None:
        self.directory = Path(spool_dir).expanduser() / database_tag(database_url)

    def journal(self, sweep_id: int) -> Journal:
        """A new journal for one sink's results (its file is created at the first append)."""
        return Journal(self.directory, sweep_id)

    def backlog(self) -> SpoolBacklog:
        """What waits in this spool now: files (live writers' and dead ones'), the results in
        them no "stored" line follows, and files set aside as `*.unstored`. Read without
        locks (lines are only appended), so a result being stored may still count."""
        files = unstored = 0
        try:
            paths = sorted(self.directory.glob("*.jsonl"))
            set_aside = sum(1 for _ in self.directory.glob("*.unstored"))
        except OSError:
            return SpoolBacklog(0, 0, 0)
        for path in paths:
            try:
                text = path.read_text(encoding="utf-8")
            except OSError:  # stored and removed meanwhile
                continue
            files += 1
            unstored += count_unstored(text)
        return SpoolBacklog(files, unstored, set_aside)

    def replay(self, store: Callable[[int, TrialResult], bool],
               is_transient: Callable[[BaseException], bool]) -> int:
        """Store the unstored results of every file no live writer holds; how many it replayed.

        `store(sweep_id, result)` writes one result (False: the trial had one already). A
        transient error stops the replay (raised; the file stays for the next try); any other
        error sets the file aside as `*.unstored` after the rest of it is stored.
        """
        if not self.directory.is_dir():
            return 0
        stored = 0
        for path in sorted(self.directory.glob("*.jsonl")):
            try:
                handle = path.open("r+", encoding="utf-8")
            except FileNotFoundError:
                continue  # its writer finished and removed it meanwhile
            except OSError as err:
                log.error("spool %s: cannot open it: %s", path, err)
                continue
            with handle:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    continue  # a live sink writes it
                try:
                    pending = unstored_results(handle.read(), path)
                except ValueError as err:  # another format, or results this version rejects
                    log.error("spool %s: unreadable (%s); set aside as *.unstored", path, err)
                    path.rename(path.with_suffix(".unstored"))
                    continue
                stored += self._replay_file(path, pending, store, is_transient)
        try:
            self.directory.rmdir()  # leave no empty directories behind
        except OSError:
            pass  # a journal or a set-aside file is there
        return stored

    @staticmethod
    def _replay_file(path: Path, pending, store, is_transient) -> int:
        refused = 0
        for seq, (sweep_id, result) in sorted(pending.items()):
            try:
                new = store(sweep_id, result)
            except Exception as err:
                if is_transient(err):
                    raise
                refused += 1
                log.error("spool %s: sweep %s: the database refused the result of %s: %s",
                          path.name, sweep_id, result.trial.key, type(err).__name__)
                continue
            log.warning("spool %s: sweep %s: replayed the result of %s%s", path.name, sweep_id,
                        result.trial.key, "" if new else " (it had one already; kept the first)")
        if refused:
            path.rename(path.with_suffix(".unstored"))
            log.error("spool %s: %d result(s) kept in %s", path.name, refused,
                      path.with_suffix(".unstored"))
        else:
            path.unlink(missing_ok=True)
        return len(pending) - refused


@dataclasses.dataclass(frozen=True)
class SpoolBacklog:
    """Spool.backlog(): results waiting for the database on this host."""

    files: int
    unstored_results: int
    set_aside_files: int


def count_unstored(text: str) -> int:
    """How many "result" lines of a spool file no "stored" line follows (lines cut short by
    a crash, or of another format, are not counted)."""
    seqs: set[int] = set()
    for line in text.splitlines():
        try:
            record = json.loads(line)
            op, seq = record["op"], record["seq"]
        except (ValueError, KeyError, TypeError):
            continue
        if op == "result":
            seqs.add(seq)
        elif op == "stored":
            seqs.discard(seq)
    return len(seqs)


def unstored_results(text: str, path: Path | None = None) -> dict[int, tuple[int, TrialResult]]:
    """seq → (sweep_id, result) of the "result" lines that no "stored" line follows."""
    results: dict[int, tuple[int, TrialResult]] = {}
    for number, line in enumerate(text.splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut short by a crash: its sink never returned
            log.warning("spool %s: line %d is incomplete; skipped", path, number)
            continue
        if record.get("v") != VERSION:
            raise ValueError(f"spool {path}: line {number} has format {record.get('v')!r}, "
                             f"not {VERSION}")
        if record["op"] == "result":
            results[record["seq"]] = (record["sweep_id"],
                                      TrialResult.model_validate(record["result"]))
        elif record["op"] == "stored":
            results.pop(record["seq"], None)
    return results


class Journal:
    """One sink's spool file: `append` before the database write, `mark_stored` after it.
    The file exists (locked) only while some result is unstored. Thread-safe."""

    def __init__(self, directory: Path, sweep_id: int) -> None:
        self.directory, self.sweep_id = directory, sweep_id
        self._lock = threading.Lock()
        self._file = None
        self.path: Path | None = None
        self._seq = 0
        self._unstored: set[int] = set()

    def append(self, result: TrialResult) -> int:
        """Write `result` durably (fsync); its sequence number for `mark_stored`."""
        with self._lock:
            if self._file is None:
                self._open()
            self._seq += 1
            self._write({"op": "result", "seq": self._seq, "sweep_id": self.sweep_id,
                         "result": result.model_dump(mode="json")}, sync=True)
            self._unstored.add(self._seq)
            return self._seq

    def mark_stored(self, seq: int) -> None:
        """The database has result `seq`; the file goes once nothing in it is unstored."""
        with self._lock:
            if self._file is None or seq not in self._unstored:
                return
            self._unstored.discard(seq)
            if self._unstored:
                self._write({"op": "stored", "seq": seq}, sync=False)
                return
            self.path.unlink(missing_ok=True)  # unlinked while locked: no replayer reads it
            self._file.close()
            self._file = self.path = None
            try:
                self.directory.rmdir()  # leave no empty directories behind
            except OSError:
                pass  # another journal's file is there

    def close(self) -> None:
        """Stop writing; a file with unstored results stays for `Spool.replay`."""
        with self._lock:
            if self._file is not None:
                self._file.close()  # releases the lock
                self._file = None

    def _open(self) -> None:
        name = f"{socket.gethostname()}-{os.getpid()}-sweep{self.sweep_id}-{secrets.token_hex(4)}"
        # Locked under a name replays ignore, then renamed: a replayer never sees it unlocked.
        hidden = self.directory / f".{name}.tmp"
        for _ in range(3):
            self.directory.mkdir(parents=True, exist_ok=True)
            try:
                handle = hidden.open("x", encoding="utf-8")
                break
            except FileNotFoundError:  # another journal removed the empty directory just now
                continue
        else:
            raise FileNotFoundError(f"cannot create {hidden}")
        fcntl.flock(handle, fcntl.LOCK_EX)
        self.path = self.directory / f"{name}.jsonl"
        hidden.rename(self.path)
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)  # the file's name survives a power cut too
        finally:
            os.close(fd)
        self._file = handle

    def _write(self, record: dict, *, sync: bool) -> None:
        self._file.write(json.dumps({"v": VERSION, **record}) + "\n")
        self._file.flush()
        if sync:
            os.fsync(self._file.fileno())
