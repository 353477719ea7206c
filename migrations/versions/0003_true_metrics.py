"""True metrics: attempt history, measurement spread, repeats, the one-chip baseline, and the
figures that say what was measured (peak FLOP/s dtype, device name, measured vs estimated vs
predicted memory, compile time, the verified prefix).

- `trial_attempts`: one row per attempt of a trial (PK trial_id, attempt), written with the
  result. Results stored before this revision have none (their history was not kept).
- `trials.repeat`, `results.repeat` (0 for existing rows) and `trials.baseline_key`: existing
  chips > 1 trials get the key of their sweep's chips=1 trial of the same mode and settings
  (old sweeps ran one chip per mode), so their rows show a speed-up too.
- New result columns, NULL for existing rows. Existing JAX rows stored XLA's compile-time
  estimate as their peak memory (memory_source 'xla_memory_analysis'): it moves to
  estimated_memory_bytes_per_chip, so peak_memory_bytes_per_chip holds measured figures only.
- Stored sweep specs gain `repeats: 1` and `one_chip_baseline: false`: a resumed old sweep
  expands to exactly the trials it was created with (one chip per mode).
- The planning views are recreated with the columns a planner needs to trust a figure.

Revision ID: 0003_true_metrics
Revises: 0002_step_settings
Create Date: 2027-01-15
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from migrations.views import create_views, drop_views, views_of

revision = "0003_true_metrics"
down_revision = "0002_step_settings"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)
GRID = "preset, num_layers, accelerator_type, dtype, param_sharding, remat"
XLA_ESTIMATE = "xla_memory_analysis"
"""memory_source of the JAX rows before this revision: XLA's estimate, not a measurement."""

NEW_RESULT_COLUMNS = (
    ("peak_flops_dtype", sa.String(16)), ("device_name", sa.Text),
    ("measured_steps", sa.Integer), ("step_time_min_s", sa.Float),
    ("step_time_max_s", sa.Float), ("compile_time_s", sa.Float),
    ("estimated_memory_bytes_per_chip", sa.BigInteger), ("estimated_memory_source", sa.Text),
    ("predicted_memory_bytes_per_chip", sa.BigInteger), ("verified_seq_len", sa.Integer),
)
SPEC_DEFAULTS_OF_OLD_SWEEPS = {"repeats": 1, "one_chip_baseline": False}
BACKFILL_BASELINE_KEYS = """
UPDATE trials SET baseline_key = (
    SELECT b.key FROM trials b
    WHERE b.sweep_id = trials.sweep_id AND b.chips = 1 AND b.framework = trials.framework
      AND b.mode = trials.mode AND b.seq_len = trials.seq_len AND b.dtype = trials.dtype
      AND b.param_sharding = trials.param_sharding AND b.remat = trials.remat)
WHERE chips > 1
"""

# Documented in service/README.md ("Capacity planning in SQL"); keep the two in step.
BEST_TOKENS_VIEW = f"""
CREATE VIEW best_tokens_per_s_per_chip AS
SELECT {GRID}, seq_len, framework, mode, chips, batch_size,
       tokens_per_s_per_chip, mfu, step_time_s, step_time_min_s, step_time_max_s,
       measured_steps, peak_flops_dtype, device_name,
       peak_memory_bytes_per_chip, memory_source, estimated_memory_bytes_per_chip,
       predicted_memory_bytes_per_chip, trial_id, sweep_id, finished_at
FROM (
    SELECT r.*,
           ROW_NUMBER() OVER (
               PARTITION BY {GRID}, seq_len
               ORDER BY tokens_per_s_per_chip DESC, trial_id) AS rn
    FROM results r
    WHERE status = 'succeeded' AND tokens_per_s_per_chip IS NOT NULL
) ranked
WHERE rn = 1
"""

MAX_SEQ_LEN_VIEW = f"""
CREATE VIEW max_seq_len_fit AS
SELECT {GRID}, batch_size, framework, mode, chips,
       MAX(CASE WHEN status = 'succeeded' THEN seq_len END) AS max_seq_len_succeeded,
       MIN(CASE WHEN status = 'oom' THEN seq_len END) AS min_seq_len_oom,
       MAX(CASE WHEN status = 'succeeded' THEN peak_memory_bytes_per_chip END)
           AS max_peak_memory_bytes_per_chip,
       MAX(CASE WHEN status = 'succeeded' THEN memory_source END) AS memory_source,
       MAX(CASE WHEN status = 'succeeded' THEN estimated_memory_bytes_per_chip END)
           AS max_estimated_memory_bytes_per_chip,
       MAX(CASE WHEN status = 'succeeded' THEN predicted_memory_bytes_per_chip END)
           AS max_predicted_memory_bytes_per_chip,
       COUNT(*) AS trials
FROM results
WHERE status IN ('succeeded', 'oom')
GROUP BY {GRID}, batch_size, framework, mode, chips
"""


_sweeps = sa.table("sweeps", sa.column("id", sa.Integer), sa.column("spec", sa.JSON))


def _rewrite_specs(change) -> None:
    """Apply `change(spec) -> spec | None` to every stored sweep spec (None: unchanged)."""
    bind = op.get_bind()
    for sweep_id, spec in bind.execute(sa.select(_sweeps.c.id, _sweeps.c.spec)).all():
        new = change(dict(spec or {}))
        if new is not None:
            bind.execute(_sweeps.update().where(_sweeps.c.id == sweep_id).values(spec=new))


def upgrade() -> None:
    drop_views()  # they select from results, whose columns change
    op.create_table(
        "trial_attempts",
        sa.Column("trial_id", sa.Integer, sa.ForeignKey("trials.id", ondelete="CASCADE"),
                  primary_key=True, autoincrement=False),
        sa.Column("attempt", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text),
        sa.Column("hosts", sa.JSON, nullable=False),
        sa.Column("started_at", TZ),
        sa.Column("finished_at", TZ),
    )
    with op.batch_alter_table("trials") as batch:
        batch.add_column(sa.Column("repeat", sa.Integer, nullable=False,
                                   server_default=sa.text("0")))
        batch.add_column(sa.Column("baseline_key", sa.String(200)))
    with op.batch_alter_table("results") as batch:
        batch.add_column(sa.Column("repeat", sa.Integer, nullable=False,
                                   server_default=sa.text("0")))
        for name, type_ in NEW_RESULT_COLUMNS:
            batch.add_column(sa.Column(name, type_))
    op.execute(f"UPDATE results SET estimated_memory_bytes_per_chip = peak_memory_bytes_per_chip, "
               f"estimated_memory_source = memory_source, peak_memory_bytes_per_chip = NULL, "
               f"memory_source = NULL WHERE memory_source = '{XLA_ESTIMATE}'")
    _rewrite_specs(lambda spec: {**SPEC_DEFAULTS_OF_OLD_SWEEPS, **spec}
                   if SPEC_DEFAULTS_OF_OLD_SWEEPS.keys() - spec.keys() else None)
    op.execute(BACKFILL_BASELINE_KEYS)
    create_views(BEST_TOKENS_VIEW, MAX_SEQ_LEN_VIEW)


def downgrade() -> None:
    bind = op.get_bind()
    kept = bind.execute(sa.text(
        "SELECT COUNT(*) FROM trials WHERE mode = 'none' OR repeat > 0")).scalar()
    if kept:
        raise RuntimeError(f"{kept} trial(s) are one-chip baselines (mode 'none') or repeats "
                           "(repeat > 0), which 0002 cannot express: delete those sweeps "
                           "before downgrading")
    drop_views()
    # 0002 kept XLA's estimate in the peak column when nothing was measured.
    op.execute("UPDATE results SET peak_memory_bytes_per_chip = estimated_memory_bytes_per_chip, "
               "memory_source = estimated_memory_source WHERE peak_memory_bytes_per_chip IS NULL "
               "AND estimated_memory_bytes_per_chip IS NOT NULL")
    _rewrite_specs(lambda spec: {k: v for k, v in spec.items()
                                 if k not in SPEC_DEFAULTS_OF_OLD_SWEEPS}
                   if SPEC_DEFAULTS_OF_OLD_SWEEPS.keys() & spec.keys() else None)
    with op.batch_alter_table("results") as batch:
        for name, _ in reversed(NEW_RESULT_COLUMNS):
            batch.drop_column(name)
        batch.drop_column("repeat")
    with op.batch_alter_table("trials") as batch:
        batch.drop_column("baseline_key")
        batch.drop_column("repeat")
    op.drop_table("trial_attempts")
    create_views(*views_of("0002_step_settings.py"))
