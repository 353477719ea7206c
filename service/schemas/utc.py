"""The datetime type of every API model: stored times are UTC."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from pydantic import AfterValidator


def _as_utc(value: dt.datetime) -> dt.datetime:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    return value.replace(tzinfo=dt.UTC) if value.tzinfo is None else value


UTCDatetime = Annotated[dt.datetime, AfterValidator(_as_utc)]
