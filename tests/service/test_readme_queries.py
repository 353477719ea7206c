"""The SQL the READMEs document, run as written on SQLite and PostgreSQL holding sweeps' results
as the service stores them (crud's trial rows, the sink's writer; seed.py's traceable metrics:
a real trial's numbers would change nothing the queries are checked for, and cost a minute of
trials): every statement parses and returns rows, and the planner queries answer what their
comments promise, checked against the results table itself.

The documented example asks about the 27B shapes on v5p in bfloat16 at 1M tokens; the fixture
sweeps run the tiny model on CPU chips in float32, so those literals are swapped for the
fixture's (`FIXTURE_VALUES`) and nothing else in the text is changed."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest
from sqlalchemy import select, text
from sqlalchemy.orm import Session

from service.db.engine import make_engine, make_session_factory, upgrade_database
from service.db.models import Result

from .conftest import TINY_SWEEP, scratch_postgres_database
from .seed import seed_sweep

ROOT = Path(__file__).resolve().parents[2]
READMES = (ROOT / "service" / "README.md", ROOT / "README.md")
PRESET, ACCELERATOR, DTYPE, TARGET_SEQ_LEN = "tiny", "cpu", "float32", 128
FIXTURE_VALUES = {"'qwen3.5-27b'": f"'{PRESET}'", "'v5p'": f"'{ACCELERATOR}'",
                  "'bfloat16'": f"'{DTYPE}'", "1048576": str(TARGET_SEQ_LEN)}
SWEEPS = (
    {**TINY_SWEEP, "name": "readme: torch", "modes": ["p2p"], "chips": [1, 2],
     "seq_lens": [64, TARGET_SEQ_LEN]},
    # the other framework on one of those points: a query that hides `framework` shows
    # look-alike rows (one JAX trial: its host process and compile are the slow part)
    {**TINY_SWEEP, "name": "readme: jax", "frameworks": ["jax"], "modes": ["p2p"],
     "chips": [2], "seq_lens": [TARGET_SEQ_LEN]},
    # more chips than needed, and repeats: "fewest" and "best" have something to choose from
    {**TINY_SWEEP, "name": "readme: repeats on 2 and 4 chips", "modes": ["p2p"],
     "chips": [2, 4], "seq_lens": [TARGET_SEQ_LEN], "repeats": 2},
    # 4 chips as 2 replicas × 2 CP chips: beside the dp 1 trials of those chips, a row that
    # hides `dp` would look like one of them
    {**TINY_SWEEP, "name": "readme: data parallel", "modes": ["p2p"], "chips": [4],
     "dp": [2], "seq_lens": [TARGET_SEQ_LEN]},
    # 2 chips on packed documents: beside the single-document trials of those chips, a row
    # that hides `documents` would look like one of them
    {**TINY_SWEEP, "name": "readme: packed documents", "modes": ["p2p"], "chips": [2],
     "seq_lens": [TARGET_SEQ_LEN], "documents": ["uniform:16-64"]},
)
CONFIG = ("framework", "kernels", "mode", "dp", "documents", "param_sharding", "remat",
          "num_layers", "batch_size")
"""What a configuration is, besides its chip count and the preset, chip type and dtype."""


def documented_statements() -> list[str]:
    """Every statement of every ```sql block of the READMEs, with the fixture's values."""
    statements = []
    for readme in READMES:
        for block in re.findall(r"^```sql\n(.*?)^```", readme.read_text(), re.MULTILINE | re.DOTALL):
            for statement in block.split(";"):
                code = [line for line in statement.splitlines()
                        if line.strip() and not line.strip().startswith("--")]
                if code:
                    for documented, fixture in FIXTURE_VALUES.items():
                        statement = statement.replace(documented, fixture)
                    statements.append(statement.strip())
    return statements


def documented(comment_start: str) -> str:
    """The documented statement whose leading comment starts with `comment_start`."""
    found = [s for s in documented_statements() if s.startswith(f"-- {comment_start}")]
    assert len(found) == 1, f"{len(found)} documented queries start '-- {comment_start}'"
    return found[0]


def seed_sweeps(session_factory) -> None:
    """SWEEPS in `session_factory`'s database as the scheduler leaves them (crud's trial rows,
    the sink's writer), each trial with seed.py's made-up, traceable metrics: the documented
    SQL runs on the real database, and which row it should pick is known in advance."""
    for sweep in SWEEPS:
        seed_sweep(session_factory, **sweep)


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """A SQLite database holding the sweeps' results."""
    url = f"sqlite:///{tmp_path_factory.mktemp('readme') / 'measured.db'}"
    upgrade_database(url)
    engine = make_engine(url)
    seed_sweeps(make_session_factory(engine))
    engine.dispose()
    return url


@pytest.fixture(scope="module")
def measured_postgresql():
    """A PostgreSQL database holding the same sweeps and results."""
    with scratch_postgres_database("gdn_sweep_readme") as url:
        upgrade_database(url)
        engine = make_engine(url)
        seed_sweeps(make_session_factory(engine))
        engine.dispose()
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def planner_db(request):
    """An engine on each kind of database, both holding the measured results."""
    url = (request.getfixturevalue("measured") if request.param == "sqlite"
           else request.getfixturevalue("measured_postgresql"))
    engine = make_engine(url)
    yield engine
    engine.dispose()


def answer(engine, statement: str, **params) -> list[dict]:
    with engine.connect() as conn:
        return [dict(row._mapping) for row in conn.execute(text(statement), params)]


def measured_results(engine, *statuses: str) -> list[Result]:
    """The fixture's results (the documented example's preset, chip type and dtype swapped)."""
    with Session(engine) as session:
        return list(session.scalars(select(Result).where(
            Result.preset == PRESET, Result.accelerator_type == ACCELERATOR,
            Result.dtype == DTYPE, Result.status.in_(statuses))))


def columns(row, names) -> tuple:
    return tuple(row[n] if isinstance(row, dict) else getattr(row, n) for n in names)


@pytest.mark.timeout(120)
def test_every_documented_statement_parses_and_returns_rows(planner_db):
    statements = documented_statements()
    assert len(statements) >= 3
    for statement in statements:
        assert answer(planner_db, statement), f"no rows from:\n{statement}"


FIT_ROW = ("framework", "kernels", "mode", "chips", "dp", "documents", "param_sharding",
           "remat", "num_layers", "batch_size")


@pytest.mark.timeout(300)
def test_the_fit_query_has_one_row_per_configuration(planner_db):
    found = answer(planner_db, documented("The largest sequence"))
    keys = [columns(row, FIT_ROW) for row in found]
    assert len(keys) == len(set(keys)), keys
    longest = defaultdict(int)
    for result in measured_results(planner_db, "succeeded"):
        key = columns(result, FIT_ROW)
        longest[key] = max(longest[key], result.seq_len)
    assert {key: row["max_seq_len_succeeded"] for key, row in zip(keys, found)} == longest
    assert all(row["peak_gib_per_chip"] > 0 for row in found)  # measured (process RSS)
    # both frameworks ran p2p on 2 chips: without `framework` two rows would look alike
    assert len({(mode, chips) for _, _, mode, chips, *_ in keys}) < len(keys)
    # p2p on 4 chips as one CP group and as 2 replicas: without `dp` they would look alike
    assert {dp for _, _, mode, chips, dp, *_ in keys if (mode, chips) == ("p2p", 4)} == {1, 2}
    # torch p2p on 2 chips, packed and not: without `documents` they would look alike
    assert {documents for framework, _, mode, chips, _, documents, *_ in keys
            if (framework, mode, chips) == ("torch", "p2p", 2)} == {"single", "uniform:16-64"}


@pytest.mark.timeout(300)
def test_the_fastest_query_names_the_best_trial_per_sequence_length(planner_db):
    found = answer(planner_db, documented("The fastest measured"))
    point = ("seq_len", "documents", "param_sharding", "remat", "num_layers")
    best = defaultdict(float)
    for result in measured_results(planner_db, "succeeded"):
        key = columns(result, point)
        best[key] = max(best[key], result.tokens_per_s_per_chip)
    assert len(found) == len(best)
    assert {columns(row, point): row["tokens_per_s_per_chip"] for row in found} == best
    for row in found:
        assert row["tokens_per_s"] == pytest.approx(row["tokens_per_s_per_chip"] * row["chips"])
        assert row["global_batch_size"] == row["dp"] * row["batch_size"]


FEWEST_FIT = f"""
SELECT {", ".join(CONFIG)}, MIN(chips) AS chips FROM max_seq_len_fit
WHERE preset = :preset AND accelerator_type = :accelerator AND dtype = :dtype
  AND max_seq_len_succeeded >= :target
GROUP BY {", ".join(CONFIG)}
"""
"""The fewest chips per configuration by the view's own reckoning."""


@pytest.mark.timeout(300)
def test_the_fewest_chips_query_gives_the_throughput_there(planner_db):
    found = answer(planner_db, documented("Fewest chips"))
    configs = [columns(row, CONFIG) for row in found]
    assert len(configs) == len(set(configs)), configs
    assert [row["chips"] for row in found] == sorted(row["chips"] for row in found)
    ran_target = [r for r in measured_results(planner_db, "succeeded")
                  if r.seq_len >= TARGET_SEQ_LEN]
    assert set(configs) == {columns(r, CONFIG) for r in ran_target}
    fewest = {columns(row, CONFIG): row["chips"] for row in answer(
        planner_db, FEWEST_FIT, preset=PRESET, accelerator=ACCELERATOR, dtype=DTYPE,
        target=TARGET_SEQ_LEN)}
    for row, config in zip(found, configs):
        assert row["chips"] == fewest[config] == min(
            r.chips for r in ran_target if columns(r, CONFIG) == config)
        there = [r for r in ran_target if columns(r, CONFIG) == config
                 and r.chips == row["chips"]]
        shortest = min(r.seq_len for r in there)
        best = max((r for r in there if r.seq_len == shortest),
                   key=lambda r: (r.tokens_per_s_per_chip, -r.trial_id))
        assert (row["seq_len"], row["trial_id"]) == (shortest, best.trial_id)
        assert row["tokens_per_s_per_chip"] == best.tokens_per_s_per_chip > 0
        assert row["tokens_per_s"] == pytest.approx(best.tokens_per_s_per_chip * row["chips"])
    # torch p2p ran the target on 2 chips three times (and on 4): the best of the three
    (torch_p2p,) = [row for row in found if (row["framework"], row["mode"], row["dp"],
                                             row["documents"]) == ("torch", "p2p", 1, "single")]
    assert torch_p2p["chips"] == 2
    # as 2 replicas, p2p ran it on 4 chips only: its own configuration, its own row
    (replicated,) = [row for row in found if row["dp"] == 2]
    assert (replicated["framework"], replicated["mode"], replicated["chips"]) == (
        "torch", "p2p", 4)
    assert sum(r.chips == 2 and (r.framework, r.mode, r.documents) == ("torch", "p2p", "single")
               for r in ran_target) == 3
    # on packed documents, its own configuration and row
    (packed,) = [row for row in found if row["documents"] == "uniform:16-64"]
    assert (packed["framework"], packed["mode"], packed["chips"]) == ("torch", "p2p", 2)
