"""The outage tests' private PostgreSQL really goes away and comes back with its data."""

import psycopg
import pytest

from tests.service.private_postgres import PrivatePostgres

@pytest.mark.timeout(120)
def test_private_postgres_stops_and_starts():
    with PrivatePostgres() as pg:
        conninfo = f"host=127.0.0.1 port={pg.port} user=postgres dbname={pg.database}"
        with psycopg.connect(conninfo) as c:
            c.execute("CREATE TABLE t (x int)"); c.execute("INSERT INTO t VALUES (1)"); c.commit()
        pg.stop()
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(conninfo, connect_timeout=3)
        pg.start()
        with psycopg.connect(conninfo) as c:
            assert c.execute("SELECT x FROM t").fetchall() == [(1,)]
