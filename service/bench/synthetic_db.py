"""A database for the API benchmarks: synthetic sweeps of finished trials, their results and
attempts (`fill`), in a scratch SQLite file or PostgreSQL database made and dropped here
(`ScratchDatabase`).
"""

from __future__ import annotations

import itertools
import random
import secrets
import tempfile
import time
from pathlib import Path

from sqlalchemy import insert, text
from sqlalchemy.engine import make_url

from gdn_core.cp_modes import CP_MODES
from gdn_core.presets import PRESETS
from gdn_core.train_config import FRAMEWORKS
from service.db.engine import make_engine, upgrade_database
from service.db.models import (FACT_COLUMNS, Result, Sweep, Trial, TrialAttempt, trial_values,
                               utcnow)
from workers.grid import TrialSpec, trial_key

CHIPS = (1, 2, 4, 8, 16, 32, 64, 128)
SEQ_LENS = tuple(2 ** k for k in range(10, 21))
ACCELERATORS = (("cpu", "cpu"), ("gpu", "h100"), ("tpu", "v5p"), ("tpu", "v6e"), ("gpu", "a100"))


def _status(rng: random.Random, chips: int, seq_len: int) -> str:
    if seq_len // chips > 2 ** 18 and rng.random() < 0.7:
        return "oom"
    return rng.choices(("succeeded", "failed", "timeout", "skipped"), (90, 5, 2, 3))[0]


def fill(url: str, rows: int, seed: int = 0) -> list[int]:
    """Insert synthetic sweeps of len(grid) trials each until `rows` trials; return sweep ids."""
    rng = random.Random(seed)
    presets = sorted(PRESETS)
    engine = make_engine(url)
    now, sweep_ids, trial_id = utcnow(), [], 0
    with engine.begin() as conn:
        for n in itertools.count():
            if trial_id >= rows:
                break
            preset, (kind, chip) = presets[n % len(presets)], ACCELERATORS[n % len(ACCELERATORS)]
            dtype = "bfloat16" if n % 3 else "float32"
            frameworks = ("jax",) if kind == "tpu" else FRAMEWORKS  # no torch-on-TPU path
            grid = list(itertools.product(frameworks, CP_MODES, CHIPS, SEQ_LENS))
            spec = {"name": f"bench {n}", "frameworks": list(frameworks), "modes": list(CP_MODES),
                    "chips": list(CHIPS), "seq_lens": list(SEQ_LENS), "model": {"preset": preset},
                    "dtypes": [dtype], "accelerator": {"kind": kind, "type": chip}}
            sweep_id = conn.execute(insert(Sweep).returning(Sweep.id), [{
                "name": spec["name"], "status": "finished", "spec": spec,
                "trials_total": len(grid), "trials_skipped": 0, "created_at": now}]).scalar_one()
            sweep_ids.append(sweep_id)
            trials, results, attempts = [], [], []
            for framework, mode, chips, seq_len in grid[:rows - trial_id]:
                trial_id += 1
                status = _status(rng, chips, seq_len)
                point = dict(framework=framework, mode=mode, seq_len=seq_len, dtype=dtype,
                             param_sharding="replicated", remat="none")
                spec = TrialSpec(
                    chips=chips, **point, batch_size=1, preset=preset, num_layers=8,
                    vocab_size=1024, steps=3, warmup_steps=1, accelerator_kind=kind,
                    accelerator_type=chip, verify=False, timeout_s=600.0,
                    # chips=1 once per mode (one_chip_baseline false): each mode's own baseline
                    baseline_key=trial_key(chips=1, **point) if chips > 1 else None)
                # The row the service writes for such a trial (trial_values), every column the
                # schema has: one it gains takes its TrialSpec default here too (issue 36).
                trials.append(dict(trial_values(sweep_id=sweep_id, spec=spec, status=status,
                                                created_at=now), id=trial_id, started_at=now))
                ok = status == "succeeded"
                step = seq_len / chips * 1e-5 * rng.uniform(0.8, 1.25)
                results.append(dict(
                    {k: trials[-1][k] for k in FACT_COLUMNS}, trial_id=trial_id,
                    status=status, error=None if ok else "synthetic",
                    attempts=1, hosts=["bench-host"], versions={"torch": "2.13.0"},
                    started_at=now, finished_at=now, step_time_s=step if ok else None,
                    step_time_min_s=step * 0.95 if ok else None,
                    step_time_max_s=step * 1.1 if ok else None, measured_steps=3 if ok else None,
                    tokens_per_s_per_chip=seq_len / step / chips if ok else None,
                    mfu=rng.uniform(0.05, 0.6) if ok else None,
                    peak_memory_bytes_per_chip=seq_len // chips * 4096,
                    memory_source="synthetic"))
                attempts.append(dict(trial_id=trial_id, attempt=1, status=status,
                                     reason=None if ok else "synthetic", hosts=["bench-host"],
                                     started_at=now, finished_at=now))
            conn.execute(insert(Trial), trials)
            conn.execute(insert(Result), results)
            conn.execute(insert(TrialAttempt), attempts)
    engine.dispose()
    # What autovacuum (PostgreSQL) and `PRAGMA optimize` (SQLite) do in production: planner
    # statistics, and on PostgreSQL the visibility map that lets COUNT(*) read indexes only.
    engine = make_engine(url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text("ANALYZE" if engine.dialect.name == "sqlite" else "VACUUM ANALYZE"))
    engine.dispose()
    return sweep_ids


def ensure_filled(url: str, rows: int) -> list[int]:
    """The database's sweep ids, after filling it with `rows` trials if it has none."""
    start = time.perf_counter()
    upgrade_database(url)
    engine = make_engine(url)
    with engine.connect() as conn:
        ids = list(conn.scalars(text("SELECT id FROM sweeps ORDER BY id")))
    engine.dispose()
    if ids:
        return ids
    ids = fill(url, rows)
    print(f"postgresql: {rows} trials in {len(ids)} sweeps loaded in "
          f"{time.perf_counter() - start:.1f} s", flush=True)
    return ids


class ScratchDatabase:
    """A scratch database of `backend`, removed afterwards."""

    def __init__(self, backend: str, postgres_url: str) -> None:
        if backend not in ("sqlite", "postgresql"):
            raise SystemExit(f"--backends: {backend!r} is not one of: sqlite, postgresql")
        self.backend, self.admin = backend, make_url(postgres_url).set(
            drivername="postgresql+psycopg")

    def __enter__(self) -> str:
        if self.backend == "sqlite":
            self.tmp = tempfile.TemporaryDirectory(prefix="gdn-sweep-bench-")
            return f"sqlite:///{Path(self.tmp.name) / 'bench.db'}"
        self.name = f"gdn_sweep_bench_{secrets.token_hex(4)}"
        self._admin_exec(f'CREATE DATABASE "{self.name}"')
        return self.admin.set(database=self.name).render_as_string(hide_password=False)

    def __exit__(self, *exc) -> None:
        if self.backend == "sqlite":
            self.tmp.cleanup()
        else:
            self._admin_exec(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def _admin_exec(self, sql: str) -> None:
        engine = make_engine(self.admin.render_as_string(hide_password=False),
                             isolation_level="AUTOCOMMIT")
        with engine.connect() as conn:
            conn.execute(text(sql))
        engine.dispose()
