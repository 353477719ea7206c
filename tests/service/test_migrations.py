"""Alembic: head matches the models on both databases; down and up again; the CLI action."""

from __future__ import annotations

import io

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from service.commands import db_upgrade
from service.core.db import alembic_config, current_revision, head_revision, make_engine
from service.models import Base


def test_head_matches_the_models(db_url):
    assert current_revision(db_url) == head_revision()
    engine = make_engine(db_url)
    with engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
        inspector = inspect(conn)
        assert {"best_tokens_per_s_per_chip", "max_seq_len_fit"} <= set(inspector.get_view_names())
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
    from sqlalchemy import text

    from workers.spec import SweepSpec, expand_trials

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
            "'pending', '2026-01-01')"), {"key": old_key})
    engine.dispose()
    command.upgrade(alembic_config(url), "head")
    engine = make_engine(url)
    with engine.connect() as conn:
        row = conn.execute(text("SELECT key, param_sharding, remat FROM trials")).one()
        assert tuple(row) == (trial.key, "replicated", "none")
        view_columns = {c["name"] for c in inspect(conn).get_columns("best_tokens_per_s_per_chip")}
        assert {"param_sharding", "remat"} <= view_columns
    engine.dispose()
    command.downgrade(alembic_config(url), "0001_initial")
    engine = make_engine(url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT key FROM trials")).scalar() == old_key
    engine.dispose()
