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
