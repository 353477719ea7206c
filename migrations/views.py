"""The two capacity views as the revision scripts handle them: `best_tokens_per_s_per_chip` and
`max_seq_len_fit` (documented in service/README.md, "Capacity planning in SQL").

Each revision that changes them defines its own SQL, frozen with it: BEST_TOKENS_VIEW and
MAX_SEQ_LEN_VIEW (0015's shape: functions of the step settings grouped by, and the two
constants they make). Its upgrade drops the views (they select from `results`, whose columns
it changes), alters the tables and creates its own; its downgrade restores the previous
revision's, read from that revision's file (`views_of`), never from a copy that could drift.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import op

VERSIONS_DIR = Path(__file__).with_name("versions")


def drop_views() -> None:
    """Drop both views (if they exist), the one that could depend on the other first."""
    op.execute("DROP VIEW IF EXISTS max_seq_len_fit")
    op.execute("DROP VIEW IF EXISTS best_tokens_per_s_per_chip")


def create_views(best_tokens_view: str, max_seq_len_view: str) -> None:
    """Create both views from their CREATE VIEW statements."""
    op.execute(best_tokens_view)
    op.execute(max_seq_len_view)


def views_of(revision_file: str) -> tuple[str, str]:
    """(BEST_TOKENS_VIEW, MAX_SEQ_LEN_VIEW) as the revision in `revision_file` (a file name in
    versions/, e.g. "0009_kernels.py") defines them. Revision files start with a digit, so they
    are loaded by path rather than imported."""
    path = VERSIONS_DIR / revision_file
    spec = importlib.util.spec_from_file_location(f"_gdn_sweep_migration_{path.stem}", path)
    revision = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(revision)
    return revision.BEST_TOKENS_VIEW, revision.MAX_SEQ_LEN_VIEW
