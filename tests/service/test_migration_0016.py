"""Migration 0016 (interpreted kernels): the capacity views leave out rows whose GDN or
attention kernel ran through its interpreter, however much "faster" they read, and keep every
other row (reference rows with no attention kernel, whose names are NULL, included); a
downgrade brings 0015's views back unchanged. On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from alembic import command

from gdn_core.interpreted_kernels import INTERPRETED_SUFFIX
from service.db.engine import alembic_config, current_revision, head_revision, make_engine, \
    make_session_factory

from .seed import seed_sweep
from .test_migration_0008 import _columns, _sql
from .test_migrations import empty_url  # noqa: F401 - the fixture, both databases


def _best(url: str) -> list[tuple]:
    return [tuple(r) for r in _sql(url, "SELECT seq_len, kernels, tokens_per_s_per_chip FROM "
                                        "best_tokens_per_s_per_chip ORDER BY seq_len")]


def _fit(url: str) -> list[tuple]:
    return [tuple(r) for r in _sql(url, "SELECT kernels, chips, max_seq_len_succeeded FROM "
                                        "max_seq_len_fit ORDER BY kernels, chips")]


@pytest.mark.timeout(120)
def test_0016_views_leave_out_interpreted_rows_and_downgrade_restores_0015s(empty_url):  # noqa: F811
    config = alembic_config(empty_url)
    command.upgrade(config, "head")  # seeded by today's models, then taken down to 0015
    engine = make_engine(empty_url)
    # fused trials 10× "faster": seq_len 256's interpreted in GDN, 512's in attention only
    seed_sweep(make_session_factory(engine), modes=["p2p"], chips=[1, 2], seq_lens=[256, 512],
               kernels=["reference", "fused"],
               interpreted_of=lambda t: t.kernels == "fused" and t.seq_len == 256,
               speed_of=lambda t: 10.0 if t.kernels == "fused" else 1.0)
    engine.dispose()
    _sql(empty_url, "UPDATE results SET attention_kernel = :name WHERE kernels = 'fused' AND "
         "seq_len = 512", name="splash attention" + INTERPRETED_SUFFIX)
    command.downgrade(config, "0015_documents")
    fused_wins = [(256, "fused", 2560.0), (512, "fused", 5120.0)]
    assert _best(empty_url) == fused_wins  # 0015: the interpreted rows win
    every_fit = [("fused", 1, 512), ("fused", 2, 512), ("reference", 1, 512),
                 ("reference", 2, 512)]
    assert _fit(empty_url) == every_fit
    view_0015 = _columns(empty_url, "best_tokens_per_s_per_chip")

    command.upgrade(config, "head")
    assert _best(empty_url) == [(256, "reference", 256.0), (512, "reference", 512.0)]
    assert _fit(empty_url) == [("reference", 1, 512), ("reference", 2, 512)]
    # a fused row that ran compiled kernels competes as before
    _sql(empty_url, "UPDATE results SET gdn_kernel = 'fla-core 0.6.0 chunk_gated_delta_rule', "
         "attention_kernel = NULL WHERE kernels = 'fused' AND seq_len = 512")
    assert _best(empty_url)[1] == (512, "fused", 5120.0)
    assert _fit(empty_url)[:2] == [("fused", 1, 512), ("fused", 2, 512)]
    assert _columns(empty_url, "best_tokens_per_s_per_chip") == view_0015

    command.downgrade(config, "0015_documents")
    assert _best(empty_url) == fused_wins
    assert _fit(empty_url) == every_fit
    assert _columns(empty_url, "best_tokens_per_s_per_chip") == view_0015
    command.upgrade(config, "head")
    assert current_revision(empty_url) == head_revision()
