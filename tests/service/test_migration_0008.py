"""Migration 0008 (hybrid dimensions): old rows read as the GDN-only contiguous runs they
were, their keys still resume, the views group by the new columns; a downgrade refuses to
drop hybrid or zigzag trials. On SQLite and PostgreSQL."""

from __future__ import annotations

import json

import pytest
from alembic import command
from sqlalchemy import inspect, select, text

from service.db import crud
from service.db.engine import alembic_config, current_revision, head_revision, make_engine, \
    make_session_factory
from service.db.models import Sweep, Trial
from workers.grid import expand_trials
from workers.sweep_spec import SweepSpec

from .test_migrations import OLD_SPEC, empty_url  # noqa: F401 - the fixture, both databases


def _sql(url: str, statement: str, **params):
    engine = make_engine(url)
    with engine.begin() as conn:
        rows = conn.execute(text(statement), params)
        out = rows.all() if rows.returns_rows else None
    engine.dispose()
    return out


def _columns(url: str, name: str) -> set[str]:
    engine = make_engine(url)
    columns = {c["name"] for c in inspect(engine).get_columns(name)}
    engine.dispose()
    return columns


@pytest.mark.timeout(120)
def test_0008_old_rows_are_gdn_only_contiguous_and_downgrade_guards_hybrids(empty_url):  # noqa: F811
    config = alembic_config(empty_url)
    command.upgrade(config, "0007_schedules")
    spec = SweepSpec.model_validate(OLD_SPEC)
    old = expand_trials(spec)
    _sql(empty_url, "INSERT INTO sweeps (id, name, status, spec, trials_total, trials_skipped, "
         "created_at) VALUES (1000, 'old', 'running', :spec, :n, 0, '2026-01-01')",  # PostgreSQL's
         # sequences stay at 1: the ids the new sweep will take are left free
         spec=json.dumps(spec.model_dump(mode="json")), n=len(old))
    for i, t in enumerate(old, start=1000):
        _sql(empty_url, "INSERT INTO trials (id, sweep_id, key, kind, framework, mode, chips, "
             "seq_len, batch_size, preset, num_layers, vocab_size, dtype, param_sharding, "
             "remat, steps, warmup_steps, accelerator_kind, accelerator_type, verify, "
             "timeout_s, repeat, baseline_key, status, created_at) VALUES (:id, 1000, :key, "
             "'measure', 'jax', :mode, :chips, 256, 1, 'tiny', 2, 256, 'float32', "
             "'replicated', 'none', 3, 1, 'cpu', 'cpu', false, 600, 0, :baseline, 'pending', "
             "'2026-01-01')", id=i, key=t.key, mode=t.mode, chips=t.chips,
             baseline=t.baseline_key)
    _sql(empty_url, "INSERT INTO results (trial_id, sweep_id, kind, framework, mode, chips, "
         "seq_len, batch_size, preset, num_layers, dtype, param_sharding, remat, "
         "accelerator_kind, accelerator_type, repeat, status, attempts, hosts, versions, "
         "tokens_per_s_per_chip) VALUES (1001, 1000, 'measure', 'jax', 'p2p', 2, 256, 1, 'tiny', 2, "
         "'float32', 'replicated', 'none', 'cpu', 'cpu', 0, 'succeeded', 1, '[]', '{}', 50.0)")

    command.upgrade(config, "head")
    for table in ("trials", "results"):
        assert {tuple(r) for r in _sql(empty_url, f"SELECT layers, attn_cp, layout FROM {table}")
                } == {("gdn_only", None, "contiguous")}
    # the stored spec still expands to the stored keys: a resume finds every trial
    engine = make_engine(empty_url)
    with make_session_factory(engine)() as session:
        stored = crud.stored_spec(session.get(Sweep, 1000).spec)
        keys = set(session.scalars(select(Trial.key)))
    engine.dispose()
    assert {t.key for t in expand_trials(stored)} == keys
    best = _sql(empty_url, "SELECT layers, attn_cp, layout, mode, chips FROM "
                "best_tokens_per_s_per_chip")
    assert [tuple(r) for r in best] == [("gdn_only", None, "contiguous", "p2p", 2)]
    assert {"layers", "attn_cp", "layout"} <= _columns(empty_url, "max_seq_len_fit")

    # a hybrid zigzag sweep cannot be expressed below 0008: the downgrade refuses it
    engine = make_engine(empty_url)
    with make_session_factory(engine)() as session:
        hybrid = crud.create_sweep(session=session, sweep_create=SweepSpec.model_validate(
            {**OLD_SPEC, "name": "hybrid", "layers": "hybrid", "attn_cps": ["ring"],
             "layouts": ["zigzag"]})).id
    engine.dispose()
    assert {tuple(r) for r in _sql(
        empty_url, "SELECT layers, attn_cp, layout FROM trials WHERE sweep_id = :s AND chips = 2",
        s=hybrid)} == {("hybrid", "ring", "zigzag")}
    # down to 0008 first: SQLite commits each revision's downgrade as it goes
    command.downgrade(config, "0008_hybrid_dimensions")
    with pytest.raises(RuntimeError, match="hybrid or zigzag"):
        command.downgrade(config, "0007_schedules")
    assert current_revision(empty_url) == "0008_hybrid_dimensions"
    _sql(empty_url, "DELETE FROM trials WHERE sweep_id = :s", s=hybrid)
    command.downgrade(config, "0007_schedules")
    assert not {"layers", "attn_cp", "layout"} & _columns(empty_url, "results")
    assert "attn_cp" not in _columns(empty_url, "best_tokens_per_s_per_chip")
    command.upgrade(config, "head")
    assert current_revision(empty_url) == head_revision()
