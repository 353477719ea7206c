"""Under CI (GDN_SWEEP_REQUIRE_POSTGRES, set by .ci/run) a PostgreSQL case whose server does
not answer fails; elsewhere it is skipped, saying why. Either way it names the server."""

from __future__ import annotations

import pytest

from . import conftest
from .private_postgres import free_port


@pytest.mark.timeout(30)
@pytest.mark.parametrize("required", [True, False])
def test_an_unreachable_postgres_fails_under_ci_and_skips_elsewhere(monkeypatch, required):
    closed = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"  # nothing listens
    monkeypatch.setattr(conftest, "PG_ADMIN_URL", closed)
    if required:
        monkeypatch.setenv(conftest.REQUIRE_POSTGRES_ENV, "1")
    else:
        monkeypatch.delenv(conftest.REQUIRE_POSTGRES_ENV, raising=False)
    outcome = pytest.fail.Exception if required else pytest.skip.Exception
    with pytest.raises(outcome, match=f"PostgreSQL not reachable at {closed}") as stopped:
        with conftest.scratch_postgres_database("gdn_sweep_never"):
            raise AssertionError("no database should have been made")
    assert ("PostgreSQL cases must run" in str(stopped.value)) is required
