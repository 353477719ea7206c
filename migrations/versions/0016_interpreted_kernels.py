"""Interpreted kernels (issue 34 item 1): the capacity views leave them out.

Under GDN_SWEEP_INTERPRET_KERNELS=1 a fused trial on a CPU runs its kernels through their own
interpreters (Triton's for fla-core, Pallas's for splash attention) and its result stores the
kernel's name ending " (interpreted)" in `gdn_kernel` and/or `attention_kernel`. Such a run
checks correctness; its step time is the interpreter's and its memory the interpreter's
buffers. So:

- `best_tokens_per_s_per_chip` ranks only rows that ran no kernel interpreted: an interpreted
  row is never a point's "fastest".
- `max_seq_len_fit` leaves them out as well: what fit (or ran out of memory) under an
  interpreter says nothing of what fits under the kernel.

No column changes; both views are recreated with the condition (service/db/interpreted.py is
the same test for the service's own queries). Rows stored before interpreted kernels existed
have no such name and stay in.

Revision ID: 0016_interpreted_kernels
Revises: 0015_documents
Create Date: 2026-12-08
"""

from __future__ import annotations

from migrations.views import create_views, drop_views

revision = "0016_interpreted_kernels"
down_revision = "0015_documents"
branch_labels = None
depends_on = None

GRID = ("preset, num_layers, layers, accelerator_type, dtype, param_sharding, remat, "
        "documents")

COMPILED_KERNELS = ("COALESCE(gdn_kernel, '') NOT LIKE '% (interpreted)' "
                    "AND COALESCE(attention_kernel, '') NOT LIKE '% (interpreted)'")
"""Rows that ran no kernel through its interpreter (gdn_core.interpreted_kernels'
INTERPRETED_SUFFIX; an empty name — reference rows, older rows — is no such kernel)."""

_BEST_COLUMNS = """tokens_per_s_per_chip, mfu, step_time_s, step_time_min_s, step_time_max_s,
       measured_steps, peak_flops_dtype, device_name, gdn_kernel, attention_kernel,
       peak_memory_bytes_per_chip, memory_source, estimated_memory_bytes_per_chip,
       predicted_memory_bytes_per_chip, trial_id, sweep_id, finished_at"""


def best_tokens_view(*, compiled_only: bool) -> str:
    """`best_tokens_per_s_per_chip` as 0015 made it, ranking only rows that ran compiled
    kernels when `compiled_only`. Its columns are named (not `r.*`), as 0015 explains."""
    point = f"kind, {GRID}, seq_len, framework, kernels, mode, attn_cp, layout, chips, dp"
    compiled = f" AND {COMPILED_KERNELS}" if compiled_only else ""
    return f"""
CREATE VIEW best_tokens_per_s_per_chip AS
SELECT {point},
       batch_size, dp * batch_size AS global_batch_size,
       {_BEST_COLUMNS}
FROM (
    SELECT {point}, batch_size,
           {_BEST_COLUMNS},
           ROW_NUMBER() OVER (
               PARTITION BY {GRID}, seq_len
               ORDER BY tokens_per_s_per_chip DESC, trial_id) AS rn
    FROM results r
    WHERE status = 'succeeded' AND kind = 'measure' AND tokens_per_s_per_chip IS NOT NULL{compiled}
) ranked
WHERE rn = 1
"""


def max_seq_len_view(*, compiled_only: bool) -> str:
    """`max_seq_len_fit` as 0015 made it, over rows that ran compiled kernels when
    `compiled_only`."""
    compiled = f" AND {COMPILED_KERNELS}" if compiled_only else ""
    return f"""
CREATE VIEW max_seq_len_fit AS
SELECT kind, {GRID}, batch_size, framework, kernels, mode, attn_cp, layout, chips, dp,
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
WHERE status IN ('succeeded', 'oom'){compiled}
GROUP BY kind, {GRID}, batch_size, framework, kernels, mode, attn_cp, layout, chips, dp
"""


# Documented in service/README.md ("Capacity planning in SQL"); keep the two in step.
BEST_TOKENS_VIEW = best_tokens_view(compiled_only=True)
MAX_SEQ_LEN_VIEW = max_seq_len_view(compiled_only=True)


def _replace_views(*, compiled_only: bool) -> None:
    drop_views()
    create_views(best_tokens_view(compiled_only=compiled_only),
                 max_seq_len_view(compiled_only=compiled_only))


def upgrade() -> None:
    _replace_views(compiled_only=True)


def downgrade() -> None:
    # 0015's views (the same columns); interpreted rows compete in them again
    _replace_views(compiled_only=False)
