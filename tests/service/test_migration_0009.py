"""Migration 0009 (kernels): old rows read back as the reference runs they were, their keys
still resume, the views name the kernels; a downgrade refuses to drop fused trials. On SQLite
and PostgreSQL."""

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


@pytest.mark.timeout(120)
def test_0009_old_rows_are_reference_and_downgrade_guards_fused(empty_url):  # noqa: F811
    config = alembic_config(empty_url)
    command.upgrade(config, "0008_hybrid_dimensions")
    spec = SweepSpec.model_validate(OLD_SPEC)
    old = expand_trials(spec)
    stored = spec.model_dump(mode="json")
    stored.pop("kernels")  # as 0008's code stored it: no such field
    _sql(empty_url, "INSERT INTO sweeps (id, name, status, spec, trials_total, trials_skipped, "
         "created_at) VALUES (1000, 'old', 'running', :spec, :n, 0, '2026-01-01')",
         spec=json.dumps(stored), n=len(old))
    for i, t in enumerate(old, start=1000):
        _sql(empty_url, "INSERT INTO trials (id, sweep_id, key, kind, framework, mode, chips, "
             "seq_len, batch_size, preset, num_layers, vocab_size, dtype, param_sharding, "
             "remat, layers, layout, steps, warmup_steps, accelerator_kind, accelerator_type, "
             "verify, timeout_s, repeat, baseline_key, status, created_at) VALUES (:id, 1000, "
             ":key, 'measure', 'jax', :mode, :chips, 256, 1, 'tiny', 2, 256, 'float32', "
             "'replicated', 'none', 'gdn_only', 'contiguous', 3, 1, 'cpu', 'cpu', false, 600, "
             "0, :baseline, 'pending', '2026-01-01')", id=i, key=t.key, mode=t.mode,
             chips=t.chips, baseline=t.baseline_key)
    _sql(empty_url, "INSERT INTO results (trial_id, sweep_id, kind, framework, mode, chips, "
         "seq_len, batch_size, preset, num_layers, dtype, param_sharding, remat, "
         "accelerator_kind, accelerator_type, repeat, status, attempts, hosts, versions, "
         "tokens_per_s_per_chip) VALUES (1001, 1000, 'measure', 'jax', 'p2p', 2, 256, 1, "
         "'tiny', 2, 'float32', 'replicated', 'none', 'cpu', 'cpu', 0, 'succeeded', 1, '[]', "
         "'{}', 50.0)")

    command.upgrade(config, "head")
    assert {tuple(r) for r in _sql(empty_url, "SELECT kernels FROM trials")} == {("reference",)}
    assert [tuple(r) for r in _sql(
        empty_url, "SELECT kernels, gdn_kernel, attention_kernel FROM results")] == [
        ("reference", None, None)]  # nothing recorded what the old row resolved to
    # the stored spec still expands to the stored keys: a resume finds every trial
    engine = make_engine(empty_url)
    with make_session_factory(engine)() as session:
        stored_spec = crud.stored_spec(session.get(Sweep, 1000).spec)
        keys = set(session.scalars(select(Trial.key)))
        public = TrialPublic.from_row(crud.get_trial(session=session, trial_id=1001))
    engine.dispose()
    assert stored_spec.kernels == ["reference"]
    assert {t.key for t in expand_trials(stored_spec)} == keys
    assert (public.kernels, public.gdn_kernel, public.attention_kernel) == (
        "reference", None, None)
    best = _sql(empty_url, "SELECT kernels, gdn_kernel, mode, chips FROM "
                "best_tokens_per_s_per_chip")
    assert [tuple(r) for r in best] == [("reference", None, "p2p", 2)]
    assert "kernels" in _columns(empty_url, "max_seq_len_fit")

    # a fused sweep cannot be expressed below 0009: the downgrade refuses it
    engine = make_engine(empty_url)
    with make_session_factory(engine)() as session:
        fused = crud.create_sweep(session=session, sweep_create=SweepSpec.model_validate(
            {**OLD_SPEC, "name": "fused", "kernels": ["fused"]})).id
    engine.dispose()
    assert {tuple(r) for r in _sql(empty_url, "SELECT kernels FROM trials WHERE sweep_id = :s",
                                   s=fused)} == {("fused",)}
    # down to 0009 first: SQLite commits each revision's downgrade as it goes
    command.downgrade(config, "0009_kernels")
    with pytest.raises(RuntimeError, match="fused-kernel trials"):
        command.downgrade(config, "0008_hybrid_dimensions")
    assert current_revision(empty_url) == "0009_kernels"
    _sql(empty_url, "DELETE FROM trials WHERE sweep_id = :s", s=fused)
    command.downgrade(config, "0008_hybrid_dimensions")
    assert not {"kernels", "gdn_kernel", "attention_kernel"} & _columns(empty_url, "results")
    assert "kernels" not in _columns(empty_url, "trials")
    assert "kernels" not in _columns(empty_url, "best_tokens_per_s_per_chip")
    assert "attn_cp" in _columns(empty_url, "best_tokens_per_s_per_chip")  # 0008's views back
    command.upgrade(config, "head")
    assert current_revision(empty_url) == head_revision()
