"""schemathesis over the service's own OpenAPI document, against a real uvicorn on SQLite and
PostgreSQL: generated requests (valid and not) never get a 5xx, every JSON answer matches the
schema it documents, and a refused request writes nothing."""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
)
from sqlalchemy import func, select

from service.db.engine import make_engine, make_session_factory
from service.db.models import Result, Sweep, Trial


@pytest.fixture
def api_schema(api_server):
    return schemathesis.openapi.from_url(f"{api_server}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


def _row_counts(url: str) -> tuple[int, int, int]:
    engine = make_engine(url)
    try:
        with make_session_factory(engine)() as session:
            return tuple(session.scalar(select(func.count()).select_from(model))
                         for model in (Sweep, Trial, Result))
    finally:
        engine.dispose()


EXAMPLES = int(os.environ.get("GDN_SWEEP_FUZZ_EXAMPLES", "30"))
"""Generated requests per operation (derandomized, so every run sends the same ones)."""


# A load-and-fault run (80 s for PostgreSQL alone at 10 examples): the slow tier's. The default
# tier keeps the hand-written bad input of test_api_validation.py and test_api_perimeter.py.
@pytest.mark.slow
@pytest.mark.parametrize("db_url", ["sqlite", "postgresql"], indirect=True)
@pytest.mark.timeout(600)
@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_generated_requests_never_get_a_server_error(case, db_url):
    before = _row_counts(db_url)
    response = case.call_and_validate(checks=[not_a_server_error, content_type_conformance,
                                              response_schema_conformance])
    if response.status_code >= 400 and case.method.upper() == "POST":
        assert _row_counts(db_url) == before, "a refused request wrote rows"
