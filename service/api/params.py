"""Bounds of the integers the API takes in paths and query strings.

Every Integer column is int32 on PostgreSQL (SQLite holds int64), so an id or filter above
2^31 − 1 is refused with a 422 on both backends alike rather than reaching the database.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query

from service.db.bounds import DB_INT_MAX

RowId = Annotated[int, Path(ge=1, le=DB_INT_MAX, description="row id (1 … 2^31 − 1)")]
"""A sweep or trial id in a path: ids start at 1."""

Offset = Annotated[int, Query(ge=0, le=DB_INT_MAX, description="rows to skip")]
"""Rows a page skips."""
