"""Alembic: head matches the models on both databases; down and up again (both databases);
old rows stay readable (and true) across 0002 and 0003; the CLI action."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, select, text

from service.cli.commands import db_upgrade
from service.db import crud
from service.db.engine import (
    alembic_config,
    current_revision,
    head_revision,
    make_engine,
    make_session_factory,
)
from service.db.models import Base, Trial
from service.schemas.sweeps import SweepPublic
from service.schemas.trials import TrialPublic
from workers.grid import expand_trials
from workers.sweep_spec import SweepSpec

from .conftest import scratch_postgres_database


def test_head_matches_the_models(db_url):
    assert current_revision(db_url) == head_revision()
    engine = make_engine(db_url)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        inspector = inspect(conn)
        assert {"best_tokens_per_s_per_chip", "max_seq_len_fit"} <= set(inspector.get_view_names())
        assert {"idempotency_keys", "schedules", "schedule_runs"} <= set(
            inspector.get_table_names())
        trial_indexes = {i["name"] for i in inspector.get_indexes("trials")}
        assert trial_indexes - {"uq_trials_sweep_key"} == {"ix_trials_sweep_status"}
        assert {"ix_results_status_preset_accelerator", "ix_results_status_mode_chips",
                "ix_results_status_framework", "ix_results_status_tokens",
                "ix_results_status_mfu"} <= {i["name"] for i in inspector.get_indexes("results")}
    engine.dispose()


def test_downgrade_to_base_and_upgrade_again(tmp_path):
    url = f"sqlite:///{tmp_path / 'm.db'}"
    out = io.StringIO()
    assert db_upgrade(database_url=url, out=out) == 0
    assert out.getvalue().strip().endswith(f"at revision {head_revision()}")
    command.downgrade(alembic_config(url), "base")
    assert current_revision(url) is None
    engine = make_engine(url)
    assert set(inspect(engine).get_table_names()) == {"alembic_version"}
    engine.dispose()
    assert db_upgrade(database_url=url, out=out) == 0
    assert current_revision(url) == head_revision()


def test_0002_keeps_old_rows_findable(tmp_path):
    # A sweep stored under 0001 (keys without the step settings) upgrades to keys that name
    # every grid dimension, so resuming it finds its trials, and its rows read as
    # replicated / no remat.
    url = f"sqlite:///{tmp_path / 'old.db'}"
    command.upgrade(alembic_config(url), "0001_initial")
    spec = SweepSpec(name="old", frameworks=["torch"], modes=["p2p"], chips=[2], seq_lens=[256])
    (trial,) = expand_trials(spec)
    old_key = f"{trial.framework}/{trial.mode}/chips={trial.chips}/seq_len={trial.seq_len}"
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO sweeps (id, name, status, spec, trials_total, "
                          "trials_skipped, created_at) VALUES (1, 'old', 'running', '{}', 1, 0, "
                          "'2026-01-01')"))
        conn.execute(text(
            "INSERT INTO trials (id, sweep_id, key, framework, mode, chips, seq_len, batch_size, "
            "preset, num_layers, vocab_size, dtype, steps, warmup_steps, accelerator_kind, "
            "accelerator_type, verify, timeout_s, status, created_at) VALUES (1, 1, :key, "
            "'torch', 'p2p', 2, 256, 1, 'tiny', 2, 256, 'float32', 3, 1, 'cpu', 'cpu', 0, 600, "
            "'succeeded', '2026-01-01')"), {"key": old_key})
        conn.execute(text(
            "INSERT INTO results (trial_id, sweep_id, framework, mode, chips, seq_len, "
            "batch_size, preset, num_layers, dtype, accelerator_kind, accelerator_type, status, "
            "attempts, hosts, versions, tokens_per_s_per_chip) VALUES (1, 1, 'torch', 'p2p', 2, "
            "256, 1, 'tiny', 2, 'float32', 'cpu', 'cpu', 'succeeded', 1, '[]', '{}', 7.0)"))
    engine.dispose()
    command.upgrade(alembic_config(url), "head")
    engine = make_engine(url)
    with engine.connect() as conn:
        row = conn.execute(text("SELECT key, param_sharding, remat FROM trials")).one()
        assert tuple(row) == (trial.key, "replicated", "none")
        # SQLite rebuilds `trials` on the way (batch mode): its results must survive that.
        assert conn.execute(text("SELECT tokens_per_s_per_chip FROM results")).scalar() == 7.0
        view_columns = {c["name"] for c in inspect(conn).get_columns("best_tokens_per_s_per_chip")}
        assert {"param_sharding", "remat"} <= view_columns
    engine.dispose()
    command.downgrade(alembic_config(url), "0001_initial")
    engine = make_engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT key FROM trials")).scalar() == old_key
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request, tmp_path) -> Iterator[str]:
    """An empty database (no revision applied) of each kind, dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'empty.db'}"
        return
    with scratch_postgres_database("gdn_sweep_migrations") as url:
        yield url


def test_down_to_base_and_up_again_on_each_database(empty_url):
    config = alembic_config(empty_url)
    command.upgrade(config, "head")
    command.downgrade(config, "0003_true_metrics")
    engine = make_engine(empty_url)
    tables = set(inspect(engine).get_table_names())
    assert "idempotency_keys" not in tables and "trial_attempts" in tables
    engine.dispose()
    command.downgrade(config, "0002_step_settings")
    engine = make_engine(empty_url)
    inspector = inspect(engine)
    assert "trial_attempts" not in inspector.get_table_names()
    assert "verified_seq_len" not in {c["name"] for c in inspector.get_columns("results")}
    engine.dispose()
    command.downgrade(config, "base")
    command.upgrade(config, "head")
    assert current_revision(empty_url) == head_revision()


def _sql(url: str, statement: str, **params):
    engine = make_engine(url)
    with engine.begin() as conn:
        rows = conn.execute(text(statement), params)
        out = rows.all() if rows.returns_rows else None
    engine.dispose()
    return out


OLD_SPEC = {"name": "old", "frameworks": ["jax"], "modes": ["p2p", "all_gather"],
            "chips": [1, 2], "seq_lens": [256], "model": {"preset": "tiny"}}


def test_0003_keeps_old_rows_readable_and_true(empty_url):
    # A sweep stored under 0002: chips=1 once per mode, and a JAX result whose "peak" memory
    # was XLA's estimate. After 0003 the estimate is in its own column, the sweep still expands
    # to exactly its stored trials (so a resume finds them), and the views carry the new
    # columns. Downgrading puts everything back.
    config = alembic_config(empty_url)
    command.upgrade(config, "0002_step_settings")
    old_trials = [t.model_copy(update={"baseline_key": None}) for t in expand_trials(
        SweepSpec.model_validate({**OLD_SPEC, "one_chip_baseline": False}))]
    _sql(empty_url, "INSERT INTO sweeps (id, name, status, spec, trials_total, trials_skipped, "
         "created_at) VALUES (1, 'old', 'running', :spec, 4, 0, '2026-01-01')",
         spec=json.dumps(OLD_SPEC))
    for i, t in enumerate(old_trials, start=1):
        _sql(empty_url, "INSERT INTO trials (id, sweep_id, key, framework, mode, chips, seq_len, "
             "batch_size, preset, num_layers, vocab_size, dtype, steps, warmup_steps, "
             "accelerator_kind, accelerator_type, verify, timeout_s, status, created_at) VALUES "
             "(:id, 1, :key, 'jax', :mode, :chips, 256, 1, 'tiny', 2, 256, 'float32', 3, 1, "
             "'cpu', 'cpu', false, 600, 'pending', '2026-01-01')",
             id=i, key=t.key, mode=t.mode, chips=t.chips)
    _sql(empty_url, "INSERT INTO results (trial_id, sweep_id, framework, mode, chips, seq_len, "
         "batch_size, preset, num_layers, dtype, accelerator_kind, accelerator_type, status, "
         "attempts, hosts, versions, tokens_per_s_per_chip, peak_memory_bytes_per_chip, "
         "memory_source) VALUES (1, 1, 'jax', 'p2p', 1, 256, 1, 'tiny', 2, 'float32', 'cpu', "
         "'cpu', 'succeeded', 1, '[]', '{}', 100.0, 12345, 'xla_memory_analysis')")
    _sql(empty_url, "UPDATE trials SET status = 'succeeded' WHERE id = 1")

    command.upgrade(config, "head")
    row = _sql(empty_url, "SELECT peak_memory_bytes_per_chip, memory_source, "
               "estimated_memory_bytes_per_chip, estimated_memory_source, repeat FROM results")
    assert [tuple(r) for r in row] == [(None, None, 12345, "xla_memory_analysis", 0)]
    engine = make_engine(empty_url)
    with make_session_factory(engine)() as session:
        sweep = crud.get_sweep(session=session, sweep_id=1)
        spec = SweepPublic.from_row(sweep, counts={}, queue_position=None).spec
        stored = {t.key: t.baseline_key for t in session.scalars(select(Trial))}
        trial = TrialPublic.from_row(crud.get_trial(session=session, trial_id=1))
        two_chips = TrialPublic.from_row(crud.get_trial(session=session, trial_id=2))
    engine.dispose()
    assert (spec.one_chip_baseline, spec.repeats) == (False, 1)
    # a resume runs the same trials, and old rows name their mode's one-chip trial
    assert {t.key: t.baseline_key for t in expand_trials(spec)} == stored
    assert (two_chips.mode, two_chips.chips, two_chips.baseline_trial_id) == ("p2p", 2, 1)
    assert two_chips.scaling_efficiency is None  # it has no result to compare
    assert trial.attempt_history == [] and trial.estimated_memory_bytes_per_chip == 12345
    engine = make_engine(empty_url)
    views = {name: {c["name"] for c in inspect(engine).get_columns(name)}
             for name in ("best_tokens_per_s_per_chip", "max_seq_len_fit")}
    engine.dispose()
    assert {"estimated_memory_bytes_per_chip", "memory_source", "step_time_max_s",
            "device_name"} <= views["best_tokens_per_s_per_chip"]
    assert {"max_estimated_memory_bytes_per_chip", "memory_source"} <= views["max_seq_len_fit"]

    command.downgrade(config, "0002_step_settings")
    row = _sql(empty_url, "SELECT peak_memory_bytes_per_chip, memory_source FROM results")
    assert [tuple(r) for r in row] == [(12345, "xla_memory_analysis")]
    (stored,) = _sql(empty_url, "SELECT spec FROM sweeps")
    assert (json.loads(stored[0]) if isinstance(stored[0], str) else stored[0]) == OLD_SPEC


def test_downgrading_past_0003_refuses_to_lose_baselines(empty_url):
    # The sweep is written by today's models at head, then the database is taken down to 0003
    # first: Alembic commits each SQLite revision as it goes (no transactional DDL), so a
    # refused downgrade from head would leave the revisions above 0003 downgraded there.
    command.upgrade(alembic_config(empty_url), "head")
    engine = make_engine(empty_url)
    with make_session_factory(engine)() as session:
        crud.create_sweep(session=session, sweep_create=SweepSpec.model_validate(
            {**OLD_SPEC, "name": "new"}))
    engine.dispose()
    command.downgrade(alembic_config(empty_url), "0003_true_metrics")
    with pytest.raises(RuntimeError, match="one-chip baselines"):
        command.downgrade(alembic_config(empty_url), "0002_step_settings")
    assert current_revision(empty_url) == "0003_true_metrics"


def test_downgrading_past_0006_refuses_to_lose_plan_trials(empty_url):
    command.upgrade(alembic_config(empty_url), "head")
    engine = make_engine(empty_url)
    with make_session_factory(engine)() as session:
        crud.create_sweep(session=session, sweep_create=SweepSpec.model_validate(
            {**OLD_SPEC, "name": "plans", "kinds": ["plan"], "frameworks": ["jax"]}))
    engine.dispose()
    # down to 0006 first, as above: SQLite commits each revision's downgrade as it goes
    command.downgrade(alembic_config(empty_url), "0006_plan_trials")
    with pytest.raises(RuntimeError, match="plan trials"):
        command.downgrade(alembic_config(empty_url), "0005_cache_versions")
    assert current_revision(empty_url) == "0006_plan_trials"


def test_the_revision_scripts_share_one_view_loader():
    """Issue 38: the capacity views are dropped, created and read from an earlier revision in
    one place (migrations/views.py), not by a copy in each revision script."""
    versions = Path(__file__).resolve().parents[2] / "migrations" / "versions"
    copies = [path.name for path in sorted(versions.glob("*.py"))
              for text in [path.read_text()]
              if "spec_from_file_location" in text or "DROP VIEW" in text]
    assert copies == []


@pytest.mark.timeout(60)
def test_the_revision_scripts_load_from_any_working_directory(tmp_path):
    """They import migrations.views: alembic.ini's prepend_sys_path finds it wherever the
    service (or `alembic -c`) runs, not only from the checkout."""
    shown = subprocess.run(
        [sys.executable, "-c", "from service.db.engine import head_revision; "
                               "print(head_revision())"],
        cwd=tmp_path, capture_output=True, text=True, timeout=50)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip() == head_revision()
