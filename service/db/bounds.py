"""Bounds of the integers compared with Integer columns.

Every Integer column is int32 on PostgreSQL (SQLite holds int64), so a value above 2^31 − 1 is
refused with a 422 on both backends alike rather than reaching the database.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

DB_INT_MAX = 2 ** 31 - 1
"""Largest value an Integer column holds on PostgreSQL (int4)."""

DbInt = Annotated[int, Field(ge=0, le=DB_INT_MAX)]
"""A non-negative integer compared with an Integer column (a filter value)."""
