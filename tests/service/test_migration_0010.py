"""Migration 0010 (data parallelism): old rows read back as the one-replica runs they were,
their keys still resume, the views say which dp won and group by it; a downgrade refuses to
drop dp > 1 trials. On SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest
from alembic import command
from sqlalchemy import select

from service.db import crud
from service.db.engine import alembic_config, current_revision, head_revision, make_engine, \
    make_session_factory
from service.db.models import Sweep, Trial
from service.schemas.trials import TrialPublic
from workers.grid import expand_trials
from workers.sweep_spec import SweepSpec

from .test_migration_0008 import _columns, _sql
from .test_migrations import OLD_SPEC, empty_url  # noqa: F401 - the fixture, both databases


def _insert_0009_sweep(url: str) -> None:
    """OLD_SPEC as 0009's code stored it (no dp anywhere) and one succeeded result."""
    spec = SweepSpec.model_validate(OLD_SPEC)
    old = expand_trials(spec)
    stored = spec.model_dump(mode="json")
    for field in ("dp", "documents"):  # as 0009's code stored it: no such fields
        stored.pop(field)
    _sql(url, "INSERT INTO sweeps (id, name, status, spec, trials_total, trials_skipped, "
         "created_at) VALUES (1000, 'old', 'running', :spec, :n, 0, '2026-01-01')",
         spec=json.dumps(stored), n=len(old))
    for i, t in enumerate(old, start=1000):
        _sql(url, "INSERT INTO trials (id, sweep_id, key, kind, framework, mode, chips, "
             "seq_len, batch_size, preset, num_layers, vocab_size, dtype, param_sharding, "
             "remat, layers, layout, kernels, steps, warmup_steps, accelerator_kind, "
             "accelerator_type, verify, timeout_s, repeat, baseline_key, status, created_at) "
             "VALUES (:id, 1000, :key, 'measure', 'jax', :mode, :chips, 256, 1, 'tiny', 2, 256, "
             "'float32', 'replicated', 'none', 'gdn_only', 'contiguous', 'reference', 3, 1, "
             "'cpu', 'cpu', false, 600, 0, :baseline, 'pending', '2026-01-01')", id=i,
             key=t.key, mode=t.mode, chips=t.chips, baseline=t.baseline_key)
    _sql(url, "INSERT INTO results (trial_id, sweep_id, kind, framework, mode, chips, seq_len, "
         "batch_size, preset, num_layers, dtype, param_sharding, remat, accelerator_kind, "
         "accelerator_type, repeat, status, attempts, hosts, versions, tokens_per_s_per_chip) "
         "VALUES (1001, 1000, 'measure', 'jax', 'p2p', 2, 256, 1, 'tiny', 2, 'float32', "
         "'replicated', 'none', 'cpu', 'cpu', 0, 'succeeded', 1, '[]', '{}', 50.0)")


@pytest.mark.timeout(120)
def test_0010_old_rows_are_one_replica_and_downgrade_guards_dp(empty_url):  # noqa: F811
    config = alembic_config(empty_url)
    command.upgrade(config, "0009_kernels")
    _insert_0009_sweep(empty_url)

    command.upgrade(config, "head")
    assert {tuple(r) for r in _sql(empty_url, "SELECT dp FROM trials")} == {(1,)}
    assert [tuple(r) for r in _sql(empty_url, "SELECT dp FROM results")] == [(1,)]
    # the stored spec still expands to the stored keys: a resume finds every trial
    engine = make_engine(empty_url)
    with make_session_factory(engine)() as session:
        stored_spec = crud.stored_spec(session.get(Sweep, 1000).spec)
        keys = set(session.scalars(select(Trial.key)))
        public = TrialPublic.from_row(crud.get_trial(session=session, trial_id=1001))
    engine.dispose()
    assert stored_spec.dp == [1]
    assert {t.key for t in expand_trials(stored_spec)} == keys
    assert not any("/dp=" in key for key in keys)
    assert (public.dp, public.batch_size, public.global_batch_size) == (1, 1, 1)
    best = _sql(empty_url, "SELECT mode, chips, dp, batch_size, global_batch_size FROM "
                "best_tokens_per_s_per_chip")
    assert [tuple(r) for r in best] == [("p2p", 2, 1, 1, 1)]
    fit = _sql(empty_url, "SELECT mode, chips, dp, max_seq_len_succeeded FROM max_seq_len_fit")
    assert [tuple(r) for r in fit] == [("p2p", 2, 1, 256)]

    # a data-parallel sweep: its rows say so, and 0009 cannot express them
    engine = make_engine(empty_url)
    with make_session_factory(engine)() as session:
        replicated = crud.create_sweep(session=session, sweep_create=SweepSpec.model_validate(
            {**OLD_SPEC, "name": "dp", "chips": [2, 4], "dp": [2]})).id
    engine.dispose()
    assert {tuple(r) for r in _sql(
        empty_url, "SELECT mode, chips, dp FROM trials WHERE sweep_id = :s", s=replicated)} == {
        ("none", 2, 2), ("p2p", 4, 2), ("all_gather", 4, 2)}
    # down to 0010 first: SQLite commits each revision's downgrade as it goes
    command.downgrade(config, "0010_data_parallel")
    with pytest.raises(RuntimeError, match=r"data-parallel trials \(dp > 1\)"):
        command.downgrade(config, "0009_kernels")
    assert current_revision(empty_url) == "0010_data_parallel"
    _sql(empty_url, "DELETE FROM trials WHERE sweep_id = :s", s=replicated)
    command.downgrade(config, "0009_kernels")
    assert "dp" not in _columns(empty_url, "results") | _columns(empty_url, "trials")
    assert "dp" not in _columns(empty_url, "best_tokens_per_s_per_chip")
    assert "kernels" in _columns(empty_url, "max_seq_len_fit")  # 0009's views back
    command.upgrade(config, "head")
    assert current_revision(empty_url) == head_revision()
