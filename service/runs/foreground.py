"""`gdn-sweep run` and `deploy/run_sweep.py`: one sweep in the foreground, into the database
(`run_sweep_into_db`) or a JSON-lines file (`run_sweep_into_jsonl`), then a summary table.

The sweep is recorded like one submitted to the API (the dashboard shows it live) and is
claimed by this process (`cli@<host>:<pid>:<start>`), so a service scheduler on the same
database leaves it alone while this process renews its heartbeat.

The file goes through the API's checks (SweepSpec, the grid cap, the model's presets) before
anything is written; a bad one is one message and exit code 2. Exit codes: 0 when every trial
succeeded or was skipped, 1 otherwise, 2 bad input, 130 Ctrl-C. Ctrl-C stops the running
trials and puts the sweep back in the queue (`queued`, no runner; the stopped trials
`pending`): running the same file again, `--resume ID`, or a service on the database
resumes it at once. `new=True` (a nightly run) always makes a new sweep.

Before anything runs, in this order: the file, the sink (the database is reached and
migrated; a JSON-lines file's folder exists), then Ray (an address that nothing answers is
refused in seconds, not after Ray's minutes of retries). Each failure is one line, no
traceback: exit 2 for bad input (the file, a bad database URL, a results file that holds
another sweep), 1 when the database or Ray cannot be reached.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import socket
import sys
import threading
from pathlib import Path
from typing import TextIO

from pydantic import ValidationError
from sqlalchemy import func, select, update

from service.core.config import Settings
from service.core.logging import sweep_event_logger
from service.db import crud
from service.db.engine import make_engine, make_session_factory, upgrade_database
from service.db.models import FINAL_SWEEP_STATUSES, Sweep, Trial
from service.runs import sweep_run
from service.runs.admission import grid_cap_error, validation_text
from service.runs.ray_setup import RayConnection
from service.runs.sink import DatabaseSink, clean_error, is_transient
from workers.events import TrialFinished
from workers.grid import expand_trials
from workers.result import FINAL_STATUSES, TrialResult
from workers.result_sink import JsonLinesError, JsonLinesSink, read_jsonl
from workers.sweep_spec import SweepSpec

EXIT_OK, EXIT_TRIALS_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
SUCCESSFUL = frozenset({"succeeded", "skipped"})


class SweepFileError(ValueError):
    """A sweep file that cannot be run; str() is the message to show (it names the file)."""


def load_spec(path: str | Path, *, grid_cap: int | None = None) -> SweepSpec:
    """Read a sweep YAML (or JSON) file into the API's SweepSpec, with the API's checks: the
    spec, the grid cap (when given) and the model's presets. SweepFileError if any fails."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SweepFileError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise SweepFileError(f"{path}: not a text file (UTF-8)") from None
    except OSError as err:
        raise SweepFileError(f"{path}: cannot read it ({err.strerror or err})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as err:
        mark, context = err.problem_mark or err.context_mark, ""
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        if err.problem and err.context and err.context_mark is not None:
            context = f" ({err.context} at line {err.context_mark.line + 1})"
        raise SweepFileError(f"{path}{where}: not valid YAML: "
                             f"{err.problem or err.context}{context}") from None
    except yaml.YAMLError as err:
        raise SweepFileError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        held = "nothing" if data is None else f"a {type(data).__name__}"
        raise SweepFileError(f"{path}: a sweep is a YAML mapping (name: …, frameworks: […], "
                             f"…); this file holds {held}")
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise SweepFileError(f"{path}: not a valid sweep:\n{validation_text(err)}") from None
    too_large = None if grid_cap is None else grid_cap_error(spec, grid_cap)
    if too_large is not None:
        raise SweepFileError(f"{path}: {too_large['msg']}")
    try:
        expand_trials(spec)  # what POST /api/sweeps does: a model the presets cannot build
    except ValueError as err:
        raise SweepFileError(f"{path}: model: {err}") from None
    return spec


def needs_ray(spec: SweepSpec) -> bool:
    """False when every trial is skipped (recorded without running): no Ray to start."""
    return any(trial.skip_reason is None for trial in expand_trials(spec))


class ProgressBar:
    """One line redrawn in place on a terminal; one line per finished trial otherwise.
    Silent once `stopped` is set (the driver then reports trials it never finished)."""

    def __init__(self, out: TextIO, *, enabled: bool = True, width: int = 30) -> None:
        self.out, self.enabled, self.width = out, enabled, width
        self.tty = enabled and hasattr(out, "isatty") and out.isatty()
        self.counts: dict[str, int] = {}
        self.stopped = threading.Event()

    def on_event(self, event) -> None:
        if not self.enabled or self.stopped.is_set() or not isinstance(event, TrialFinished):
            return
        status = event.result.status
        self.counts[status] = self.counts.get(status, 0) + 1
        filled = int(self.width * event.done / max(event.total, 1))
        counts = " ".join(f"{k} {v}" for k, v in sorted(self.counts.items()))
        line = (f"[{'#' * filled}{'.' * (self.width - filled)}] {event.done}/{event.total} "
                f"{counts} | {event.result.trial.key} {status}")
        if self.tty:
            self.out.write("\r\x1b[2K" + line)
            if event.done == event.total:
                self.out.write("\n")
        else:
            self.out.write(line + "\n")
        self.out.flush()


def run_sweep_into_db(spec_path: str | Path | None, *, settings: Settings,
                      resume_sweep_id: int | None = None, new: bool = False,
                      progress: bool = True, out: TextIO | None = None,
                      summary_out: TextIO | None = None, driver_options=None) -> int:
    """Run a sweep file (or resume a recorded sweep) to the end; exit code 0, 1, 2 or 130
    (see the module); the log gets one line per trial event. The sweep's id and a summary
    table go to `summary_out` (default stdout) at the end; the rest to `out` (stderr)."""
    out, summary_out = out or sys.stderr, summary_out or sys.stdout
    spec = None
    if resume_sweep_id is None:
        try:  # before the database is touched: a bad file writes nothing
            spec = load_spec(spec_path, grid_cap=settings.grid_cap)
        except SweepFileError as err:
            print(err, file=sys.stderr)
            return EXIT_BAD_INPUT
    runner_id = sweep_run.runner_identity("cli")
    failed = database_error(settings.database_url)
    if failed is not None:
        print(failed[1], file=sys.stderr)
        return failed[0]
    engine = make_engine(settings.database_url)
    session_factory = make_session_factory(engine)
    try:
        with session_factory() as session:
            if spec is not None and new:
                sweep_id = crud.create_sweep(session=session, sweep_create=spec).id
            elif spec is not None:
                sweep_id = _sweep_for(session, spec, runner_id, settings.lease_s)
            else:
                sweep = crud.get_sweep(session=session, sweep_id=resume_sweep_id)
                if sweep is None:
                    print(f"sweep {resume_sweep_id} not found in the database", file=sys.stderr)
                    return EXIT_BAD_INPUT
                if sweep.status in FINAL_SWEEP_STATUSES:
                    print(f"sweep {resume_sweep_id} is already {sweep.status}", file=out)
                    _print_summary(summary_out, sweep.id, sweep.name, sweep.status,
                                   _db_rows(session, sweep.id))
                    return _outcome(session, sweep.id)
                sweep_id, spec = sweep.id, SweepSpec.model_validate(sweep.spec)
            claimed = sweep_run.claim(session=session, sweep_id=sweep_id, runner_id=runner_id,
                                      lease_s=settings.lease_s)
            if claimed is None:
                print(f"sweep {sweep_id} is being run by another live runner", file=sys.stderr)
                return EXIT_TRIALS_FAILED
        print(f"sweep {sweep_id} {spec.name!r}: {spec.grid_size} trial(s) into "
              f"{engine.url.render_as_string(hide_password=True)}", file=out)
        ray = RayConnection.from_settings(settings)
        try:
            needed = claimed == "running" and needs_ray(spec)
            unreachable = ray_address_error(settings.ray_address) if needed else None
            if needed and unreachable is None and not ray.ensure():
                unreachable = _first_line(ray.error)
            if unreachable is not None:
                error = f"cannot reach Ray: {unreachable}"
                with session_factory() as session:
                    sweep_run.finish(session=session, sweep_id=sweep_id, status="failed",
                                     error=error)
                print(error, file=sys.stderr)
                return EXIT_TRIALS_FAILED
            return _drive(session_factory, sweep_id, spec, settings, runner_id, claimed,
                          ProgressBar(out, enabled=progress), out, driver_options, summary_out)
        finally:
            ray.shutdown()
    finally:
        engine.dispose()


def _drive(session_factory, sweep_id, spec, settings, runner_id, claimed, bar, out,
           driver_options, summary_out) -> int:
    cancel_event, error = threading.Event(), None
    if claimed == "running":
        log_event = sweep_event_logger(lambda: sweep_id)

        def on_driver_event(event) -> None:
            bar.on_event(event)
            log_event(event)

        try:
            error = sweep_run.drive(
                session_factory=session_factory, sweep_id=sweep_id, spec=spec,
                sink=DatabaseSink(session_factory, sweep_id), cancel_event=cancel_event,
                runner_id=runner_id, max_concurrent_trials=settings.max_concurrent_trials,
                poll_s=settings.scheduler_poll_s, on_event=on_driver_event,
                driver_options=driver_options)
        except KeyboardInterrupt:  # drive() detached the sink and stopped the driver
            bar.stopped.set()
            with session_factory() as session:
                pending, done = _requeue(session, sweep_id, runner_id)
            print(f"\nsweep {sweep_id} stopped: {pending} trial(s) stay pending for a resume "
                  f"({done} done); run the same command again (or `gdn-sweep run --resume "
                  f"{sweep_id} --db …`) to finish them, or cancel the sweep from the dashboard",
                  file=out)
            return EXIT_INTERRUPTED
    status = ("failed" if error else "cancelled" if cancel_event.is_set() or claimed != "running"
              else "finished")
    with session_factory() as session:
        sweep_run.finish(session=session, sweep_id=sweep_id, status=status,
                         error=None if error is None else f"sweep driver failed: {error}")
        counts = crud.status_counts(session=session, sweep_ids=[sweep_id])[sweep_id]
        code = _outcome(session, sweep_id)
        rows = _db_rows(session, sweep_id)
    shown = ", ".join(f"{k} {v}" for k, v in counts.items() if v and k in FINAL_STATUSES)
    print(f"sweep {sweep_id}: {status} ({shown})", file=out)
    _print_summary(summary_out, sweep_id, spec.name, status, rows)
    return code


def _outcome(session, sweep_id: int) -> int:
    """0 when every trial of the sweep succeeded or was skipped, else 1."""
    counts = crud.status_counts(session=session, sweep_ids=[sweep_id])[sweep_id]
    return EXIT_OK if all(n == 0 or s in SUCCESSFUL for s, n in counts.items()) \
        else EXIT_TRIALS_FAILED


def _requeue(session, sweep_id: int, runner_id: str) -> tuple[int, int]:
    """After Ctrl-C: the sweep back to `queued` with no runner and its stopped trials back to
    `pending` (what the dashboard then shows is true, and any runner resumes it at once); a
    `cancelling` one only loses its runner. Returns (trials left to run, trials done)."""
    requeued = session.execute(update(Sweep).where(
        Sweep.id == sweep_id, Sweep.runner == runner_id, Sweep.status == "running").values(
        status="queued", runner=None, heartbeat_at=None)).rowcount
    if requeued:
        session.execute(update(Trial).where(Trial.sweep_id == sweep_id,
                                            Trial.status == "running").values(
            status="pending", started_at=None))
    session.commit()
    sweep_run.release(session=session, sweep_id=sweep_id, runner_id=runner_id)
    open_trials = session.scalar(select(func.count()).select_from(Trial).where(
        Trial.sweep_id == sweep_id, Trial.status.not_in(FINAL_STATUSES))) or 0
    total = session.scalar(select(func.count()).select_from(Trial).where(
        Trial.sweep_id == sweep_id)) or 0
    return open_trials, total - open_trials


def _sweep_for(session, spec: SweepSpec, runner_id: str, lease_s: float) -> int:
    """An unfinished sweep of exactly this spec that no live runner holds (so running the same
    file again resumes it), else a new one."""
    wanted = spec.model_dump(mode="json")
    for sweep in session.scalars(select(Sweep).where(
            Sweep.name == spec.name, Sweep.status.in_(("queued", "running")))
            .order_by(Sweep.id.desc())):
        if sweep.spec == wanted and sweep_run.claimable(
                session=session, sweep_id=sweep.id, runner_id=runner_id, lease_s=lease_s):
            return sweep.id
    return crud.create_sweep(session=session, sweep_create=spec).id


# -- checks made before anything runs ------------------------------------------------------

def database_error(url: str) -> tuple[int, str] | None:
    """None when the database at `url` answers and is migrated (this migrates it), else (exit
    code, one-line reason): 2 for a URL that names no database SQLAlchemy knows, 1 for one
    that cannot be reached. Failing fast here, before Ray: a nightly run must not wait."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        shown = make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return EXIT_BAD_INPUT, (f"{url!r} is not a database URL (e.g. sqlite:///gdn_sweep.db, "
                                f"postgresql://user@host:5432/db)")
    try:
        upgrade_database(url)
    except NoSuchModuleError as err:
        return EXIT_BAD_INPUT, f"database {shown}: {_first_line(str(err))}"
    except Exception as err:  # noqa: BLE001 - one line, whatever the driver raised
        what = "cannot reach the database" if is_transient(err) else "database error:"
        return EXIT_TRIALS_FAILED, f"{what} {shown}: {_first_line(clean_error(err))}"
    return None


RAY_CONNECT_CHECK_S = 5.0
"""How long the address of a Ray cluster may take to accept a connection."""


def ray_address_error(address: str, *, timeout_s: float = RAY_CONNECT_CHECK_S) -> str | None:
    """None when something listens at the Ray `address` (or it is empty: a local Ray is
    started), else why not, in one line. `auto` finds the cluster this machine is part of, as
    `ray.init` does. Asked before ray.init, which retries an address nothing answers for
    minutes."""
    if not address:
        return None
    if address.startswith(("http://", "https://")):
        return (f"{address} is a dashboard address (what `ray job submit` takes); the sweep "
                f"connects to the cluster itself: HEAD:6379, ray://HEAD:10001 or auto")
    target = address.removeprefix("ray://")
    if address == "auto":
        from ray._private.authentication.authentication_token_setup import (
            maybe_enable_token_auth_if_token_available,
        )
        from ray._private.services import canonicalize_bootstrap_address

        # as ray.init("auto") does: a token on this machine turns token auth on (a `ray up`
        # head has ~/.ray/auth_token but no RAY_AUTH_MODE in a `ray submit` shell)
        maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
        try:
            target = canonicalize_bootstrap_address("auto")
        except Exception as err:  # noqa: BLE001 - Ray's reason, in one line
            return f"no Ray cluster found on this machine (address auto): {_first_line(str(err))}"
        if target is None:
            return ("no Ray cluster found on this machine (address auto): start one with "
                    "`ray start --head` or `ray up`, or give --address / $RAY_ADDRESS")
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return f"{address!r} is not a Ray address (HOST:PORT, ray://HOST:PORT or auto)"
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as err:
        return f"nothing answers at {target} ({err.strerror or type(err).__name__})"
    if address.startswith("ray://"):
        return None  # a Ray Client server, not the GCS: ray.init says what is wrong
    return _gcs_error(target, timeout_s)


def _gcs_error(target: str, timeout_s: float) -> str | None:
    """Ask the GCS at `target` one question: a token it refuses is said at once here, where
    ray.init would retry for ten minutes."""
    from ray._raylet import GcsClient
    from ray.exceptions import AuthenticationError

    try:
        GcsClient(address=target).internal_kv_get(b"gdn-sweep", None, timeout=timeout_s)
    except AuthenticationError as err:
        said = str(err).split(". ")[0]
        return (f"the Ray cluster at {target} refused this process's token ({said}): set "
                f"RAY_AUTH_MODE=token and RAY_AUTH_TOKEN=<the cluster's token> (or "
                f"RAY_AUTH_TOKEN_PATH=<file>; `ray get-auth-token` on the head prints it)")
    except Exception as err:  # noqa: BLE001 - one line, whatever Ray raised
        return f"the Ray cluster at {target} does not answer: {_first_line(str(err))}"
    return None


def _first_line(text: str | None) -> str:
    lines = [line.strip() for line in (text or "").strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


# -- the summary table at the end ------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SummaryRow:
    framework: str
    mode: str
    chips: int
    seq_len: int
    settings: str
    """What else tells trials of one (framework, mode, chips, seq_len) apart."""
    status: str
    tokens_per_s_per_chip: float | None
    mfu: float | None
    peak_memory_bytes_per_chip: int | None


def _settings_text(kind, dtype, param_sharding, remat, repeat) -> str:
    parts = [dtype, param_sharding, remat] + ([f"repeat {repeat}"] if repeat else []) \
        + (["plan"] if kind == "plan" else [])
    return " ".join(parts)


def _db_rows(session, sweep_id: int) -> list[SummaryRow]:
    from service.db.models import Result

    found = session.execute(
        select(Trial.framework, Trial.mode, Trial.chips, Trial.seq_len, Trial.kind, Trial.dtype,
               Trial.param_sharding, Trial.remat, Trial.repeat, Trial.status,
               Result.tokens_per_s_per_chip, Result.mfu, Result.peak_memory_bytes_per_chip)
        .outerjoin(Result, Result.trial_id == Trial.id).where(Trial.sweep_id == sweep_id))
    return [SummaryRow(r.framework, r.mode, r.chips, r.seq_len,
                       _settings_text(r.kind, r.dtype, r.param_sharding, r.remat, r.repeat),
                       r.status, r.tokens_per_s_per_chip, r.mfu, r.peak_memory_bytes_per_chip)
            for r in found]


def _result_rows(spec: SweepSpec, results: dict[str, TrialResult]) -> list[SummaryRow]:
    rows = []
    for trial in expand_trials(spec):
        result = results.get(trial.key)
        metrics = result.metrics if result is not None else None
        rows.append(SummaryRow(
            trial.framework, trial.mode, trial.chips, trial.seq_len,
            _settings_text(trial.kind, trial.dtype, trial.param_sharding, trial.remat,
                           trial.repeat),
            result.status if result is not None else "pending",
            metrics and metrics.tokens_per_s_per_chip, metrics and metrics.mfu,
            metrics and metrics.peak_memory_bytes_per_chip))
    return rows


def _bytes(value: int | None) -> str:
    if value is None:
        return "-"
    for scale, unit in ((2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


def summary_table(rows: list[SummaryRow]) -> str:
    """One line per trial, sorted by framework, mode, chips, seq_len: status, tokens/s/chip,
    MFU, peak memory per chip. A settings column only when the sweep varies dtype, sharding,
    remat, repeats or kind (it then tells rows of one grid point apart)."""
    rows = sorted(rows, key=lambda r: (r.framework, r.mode, r.chips, r.seq_len, r.settings))
    with_settings = len({r.settings for r in rows}) > 1
    header = ["framework", "mode", "chips", "seq_len", *(["settings"] if with_settings else []),
              "status", "tok/s/chip", "MFU", "mem/chip"]
    table = [header] + [
        [r.framework, r.mode, str(r.chips), str(r.seq_len),
         *([r.settings] if with_settings else []), r.status,
         "-" if r.tokens_per_s_per_chip is None else f"{r.tokens_per_s_per_chip:.4g}",
         "-" if r.mfu is None else f"{r.mfu:.2%}", _bytes(r.peak_memory_bytes_per_chip)]
        for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    numeric = {"chips", "seq_len", "tok/s/chip", "MFU", "mem/chip"}
    return "\n".join("  ".join(cell.rjust(w) if name in numeric else cell.ljust(w)
                               for cell, w, name in zip(line, widths, header)).rstrip()
                     for line in table) + "\n"


def _print_summary(out: TextIO, sweep: int | str, name: str, status: str,
                   rows: list[SummaryRow]) -> None:
    print(f"sweep {sweep} {name!r}: {status}", file=out)
    out.write(summary_table(rows))
    out.flush()


# -- into a JSON-lines file ------------------------------------------------------------------

class ResultsFileError(ValueError):
    """A results file or folder that cannot take this sweep; str() is the one-line reason."""


def jsonl_target(spec: SweepSpec, target: str | None, *, new: bool,
                 now: dt.datetime | None = None) -> tuple[Path, bool]:
    """(the file this run writes, whether it is a new file) for `--jsonl target`:

    - a folder (one that exists, or a path ending in /): a new file per run,
      `<folder>/<name>-<UTC time>.jsonl` (a scheduled run gets its own file and sweep);
    - a file: a new one is made; an existing one holding this very sweep is resumed, unless
      `new` (then refused: one file holds one sweep); one holding another sweep is refused;
    - None: `<name>.jsonl` here, as a file.
    The folder must exist: ResultsFileError otherwise, before anything runs."""
    path = Path(target if target is not None else f"{spec.name}.jsonl")
    if target is not None and (target.endswith(("/", "\\")) or path.is_dir()):
        if not path.is_dir():
            raise ResultsFileError(f"--jsonl {target}: no such folder")
        stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
        candidate, n = path / f"{spec.name}-{stamp}.jsonl", 1
        while candidate.exists():
            n += 1
            candidate = path / f"{spec.name}-{stamp}-{n}.jsonl"
        return candidate, True
    if not path.parent.is_dir():
        raise ResultsFileError(f"--jsonl {path}: the folder {path.parent} does not exist")
    if not path.exists():
        return path, True
    try:
        held = read_jsonl(path)
    except JsonLinesError as err:
        raise ResultsFileError(str(err)) from None
    if held.header is None:
        raise ResultsFileError(f"{path}: holds results without a sweep header (written by an "
                               f"older gdn-sweep); give another file or a folder")
    if new:
        raise ResultsFileError(f"{path} already holds sweep {held.header['uid']} "
                               f"({held.header['name']!r}); continue it with --resume {path}, "
                               f"or give a folder (--jsonl DIR/) for a new file per run")
    if held.spec.model_dump(mode="json") != spec.model_dump(mode="json"):
        raise ResultsFileError(f"{path} holds another sweep ({held.header['name']!r}, another "
                               f"spec); give another file, or a folder for a new file per run")
    return path, False


def run_sweep_into_jsonl(spec_path: str | Path | None, *, settings: Settings,
                         target: str | None = None, resume_file: str | Path | None = None,
                         new: bool = False, progress: bool = True, out: TextIO | None = None,
                         summary_out: TextIO | None = None, driver_options=None) -> int:
    """Run a sweep file into a JSON-lines file (see `jsonl_target`), or continue the sweep a
    file holds (`resume_file`: its header gives the spec); exit codes as run_sweep_into_db.
    The file is made only once Ray is reached: a sweep that could not run leaves no file."""
    from workers.driver import run_sweep
    from workers.progress import format_event

    out, summary_out = out or sys.stdout, summary_out or sys.stdout
    try:
        if resume_file is not None:
            held = read_jsonl(resume_file)
            if held.header is None:
                raise ResultsFileError(f"{resume_file}: no sweep header (first line); it cannot "
                                       f"be resumed")
            spec, path, fresh = held.spec, Path(resume_file), False
        else:
            spec = load_spec(spec_path, grid_cap=settings.grid_cap)
            path, fresh = jsonl_target(spec, target, new=new)
    except (SweepFileError, ResultsFileError, JsonLinesError) as err:
        print(err, file=sys.stderr)
        return EXIT_BAD_INPUT
    unreachable = ray_address_error(settings.ray_address) if needs_ray(spec) else None
    if unreachable is not None:
        print(f"cannot reach Ray: {unreachable}", file=sys.stderr)
        return EXIT_TRIALS_FAILED

    def show(event) -> None:
        line = format_event(event) if progress else None
        if line:
            print(line, file=out, flush=True)

    ray = RayConnection.from_settings(settings)
    try:
        if needs_ray(spec) and not ray.ensure():
            print(f"cannot reach Ray: {_first_line(ray.error)}", file=sys.stderr)
            return EXIT_TRIALS_FAILED
        sink = JsonLinesSink.create(path, spec) if fresh else JsonLinesSink(path)
        uid = read_jsonl(path).header["uid"]
        print(f"sweep {uid} {spec.name!r}: {spec.grid_size} trial(s) into {path}", file=out,
              flush=True)
        run_sweep(spec, sink, max_concurrent_trials=settings.max_concurrent_trials,
                  on_event=show, options=driver_options)
    except KeyboardInterrupt:
        pending = sum(r.status in ("pending", "cancelled") for r in _file_rows(path, spec))
        print(f"\nstopped: {pending} trial(s) stay pending for a resume; continue with "
              f"--resume {path} (results so far in {path})", file=sys.stderr)
        return EXIT_INTERRUPTED
    finally:
        ray.shutdown()
    rows = _file_rows(path, spec)
    ok = all(r.status in SUCCESSFUL for r in rows)
    _print_summary(summary_out, uid, spec.name, "finished" if ok else "finished with failures",
                   rows)
    print(f"results in {path}; load them with `gdn-sweep import {path} --db URL`",
          file=summary_out)
    return EXIT_OK if ok else EXIT_TRIALS_FAILED


def _file_rows(path: Path, spec: SweepSpec) -> list[SummaryRow]:
    """The summary of what the file holds: the last outcome of each trial (a resumed run
    retries cancelled ones), `pending` for trials without one."""
    if not path.exists():
        return _result_rows(spec, {})
    return _result_rows(spec, {r.trial.key: r for _, r in read_jsonl(path).results})
