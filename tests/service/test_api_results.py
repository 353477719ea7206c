"""GET /api/results: filters, sorting, paging, CSV; on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io

import pytest

from .seed import seed_sweep


@pytest.fixture
def seeded(session_factory):
    """Two sweeps: torch on cpu (float32, replicated) and jax on h100 (bfloat16, fsdp, remat
    full); oom at seq_len 512."""
    a = seed_sweep(session_factory, name="cpu", modes=["all_gather", "p2p"], chips=[1, 2, 4],
                   seq_lens=[64, 128, 256, 512],
                   status_of=lambda t: "oom" if t.seq_len == 512 else "succeeded")
    b = seed_sweep(session_factory, name="gpu", frameworks=["jax"], modes=["p2p"],
                   chips=[2], seq_lens=[1024], dtypes=["bfloat16"],
                   param_shardings=["fsdp"], remats=["full"], accelerator={"kind": "gpu", "type": "h100"})
    return a, b


def keys(page) -> list[tuple]:
    return [(t["framework"], t["mode"], t["chips"], t["seq_len"]) for t in page["data"]]


def test_only_succeeded_trials_sorted_by_throughput(client, seeded):
    page = client.get("/api/results").json()
    assert page["count"] == 2 * 3 * 3 + 1  # the oom points are not results
    values = [t["tokens_per_s_per_chip"] for t in page["data"]]
    assert values == sorted(values, reverse=True)
    assert {t["status"] for t in page["data"]} == {"succeeded"}
    assert page["data"][0]["seq_len"] == 1024  # 1024 / 2 + 100


@pytest.mark.parametrize("params, expected", [
    ({"mode": "p2p", "chips": 4}, {("torch", "p2p", 4, s) for s in (64, 128, 256)}),
    ({"chips": [1, 4], "seq_len_min": 200, "seq_len_max": 300},
     {("torch", m, c, 256) for m in ("all_gather", "p2p") for c in (1, 4)}),
    ({"accelerator": "h100"}, {("jax", "p2p", 2, 1024)}),
    ({"dtype": "bfloat16", "framework": "jax"}, {("jax", "p2p", 2, 1024)}),
    ({"preset": "qwen3.5-27b"}, set()),
    ({"param_sharding": "fsdp"}, {("jax", "p2p", 2, 1024)}),
    ({"remat": ["none"], "framework": "jax"}, set()),
    ({"framework": "torch", "mode": "all_gather", "chips": 2, "seq_len_min": 128,
      "accelerator": "cpu", "dtype": "float32", "preset": "tiny"},
     {("torch", "all_gather", 2, 128), ("torch", "all_gather", 2, 256)}),
], ids=["mode-chips", "chips-list-seq-range", "accelerator", "dtype-framework", "preset-none",
        "param_sharding", "remat-framework-none", "every-filter"])
def test_filters(client, seeded, params, expected):
    page = client.get("/api/results", params=params).json()
    assert set(keys(page)) == expected and page["count"] == len(expected)


def test_sorting_and_paging(client, seeded):
    params = {"framework": "torch", "sort": "chips,-seq_len", "limit": 4}
    first = client.get("/api/results", params=params).json()
    second = client.get("/api/results", params={**params, "offset": 4}).json()
    assert first["count"] == second["count"] == 18
    got = keys(first) + keys(second)
    assert [k[2:] for k in got] == [(1, 256), (1, 256), (1, 128), (1, 128), (1, 64), (1, 64),
                                    (2, 256), (2, 256)]
    assert len(set(got)) == 8  # pages do not overlap
    mfu = client.get("/api/results", params={"sort": "mfu", "limit": 100}).json()
    assert [t["mfu"] for t in mfu["data"]] == sorted(t["mfu"] for t in mfu["data"])


def test_csv_has_a_header_and_one_line_per_result(client, seeded):
    r = client.get("/api/results", params={"format": "csv", "mode": "p2p"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == int(r.headers["x-total-count"]) == 3 * 3 + 1
    assert {"tokens_per_s_per_chip", "mfu", "peak_memory_bytes_per_chip", "accelerator",
            "versions", "param_sharding", "remat", "cp_comm_bytes_per_step_per_chip",
            "grad_sync_bytes_per_step_per_chip"} <= set(rows[0])
    # The CP and weight-sync bytes are stored apart and sum to the total.
    assert all(int(r["cp_comm_bytes_per_step_per_chip"]) + int(r["grad_sync_bytes_per_step_per_chip"])
               == int(r["comm_bytes_per_step_per_chip"]) for r in rows)
    assert rows[0]["versions"] == '{"torch": "2.13.0"}' and rows[0]["mode"] == "p2p"
    limited = client.get("/api/results", params={"format": "csv", "limit": 2}).text
    assert len(limited.strip().splitlines()) == 3


@pytest.mark.parametrize("params, loc, needle", [
    ({"sort": "-speed"}, ["query", "sort"], "tokens_per_s_per_chip"),
    ({"mode": "ring"}, ["query", "mode", 0], "'ulysses', 'p2p', 'all_gather' or 'log_scan'"),
    ({"seq_len_min": 512, "seq_len_max": 64}, ["query"], "seq_len_min=512 is larger"),
    ({"format": "xml"}, ["query", "format"], "'json' or 'csv'"),
    ({"chip": 2}, ["query", "chip"], "Extra inputs are not permitted"),
    ({"remat": "some"}, ["query", "remat", 0], "'none', 'full' or 'gdn'"),
], ids=["sort", "mode", "range", "format", "unknown", "remat"])
def test_bad_parameters_are_422_naming_them(client, params, loc, needle):
    r = client.get("/api/results", params=params)
    assert r.status_code == 422
    assert any(e["loc"] == loc and needle in e["msg"] for e in r.json()["detail"]), r.json()
