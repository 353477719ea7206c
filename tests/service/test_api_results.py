"""GET /api/results: filters, sorting, paging, CSV; on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io
import json

import pytest

from .seed import seed_sweep

NEW_FIELDS = ("repeat", "baseline_key", "baseline_trial_id", "speedup_vs_one_chip",
              "scaling_efficiency", "attempt_history", "step_time_min_s", "step_time_max_s",
              "measured_steps", "compile_time_s", "peak_flops_dtype", "device_name",
              "estimated_memory_bytes_per_chip", "estimated_memory_source",
              "predicted_memory_bytes_per_chip", "verified_seq_len")


@pytest.fixture
def seeded(session_factory):
    """Two sweeps: torch on cpu (float32, replicated; chips=1 once per seq_len, as the
    one-chip baseline) and jax on h100 (bfloat16, fsdp, remat full); oom at seq_len 512."""
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
    # 3 seq_lens × (one baseline + 2 modes × 2 chip counts), + the gpu sweep; oom is no result
    assert page["count"] == 3 * (1 + 2 * 2) + 1
    values = [t["tokens_per_s_per_chip"] for t in page["data"]]
    assert values == sorted(values, reverse=True)
    assert {t["status"] for t in page["data"]} == {"succeeded"}
    assert page["data"][0]["seq_len"] == 1024  # 1024 / 2 + 100


@pytest.mark.parametrize("params, expected", [
    ({"mode": "p2p", "chips": 4}, {("torch", "p2p", 4, s) for s in (64, 128, 256)}),
    ({"chips": [1, 4], "seq_len_min": 200, "seq_len_max": 300},
     {("torch", "none", 1, 256), ("torch", "all_gather", 4, 256), ("torch", "p2p", 4, 256)}),
    ({"mode": "none"}, {("torch", "none", 1, s) for s in (64, 128, 256)}),
    ({"accelerator": "h100"}, {("jax", "p2p", 2, 1024)}),
    ({"dtype": "bfloat16", "framework": "jax"}, {("jax", "p2p", 2, 1024)}),
    ({"preset": "qwen3.5-27b"}, set()),
    ({"param_sharding": "fsdp"}, {("jax", "p2p", 2, 1024)}),
    ({"remat": ["none"], "framework": "jax"}, set()),
    ({"framework": "torch", "mode": "all_gather", "chips": 2, "seq_len_min": 128,
      "accelerator": "cpu", "dtype": "float32", "preset": "tiny"},
     {("torch", "all_gather", 2, 128), ("torch", "all_gather", 2, 256)}),
], ids=["mode-chips", "chips-list-seq-range", "baseline", "accelerator", "dtype-framework",
        "preset-none", "param_sharding", "remat-framework-none", "every-filter"])
def test_filters(client, seeded, params, expected):
    page = client.get("/api/results", params=params).json()
    assert set(keys(page)) == expected and page["count"] == len(expected)


def test_sorting_and_paging(client, seeded):
    params = {"framework": "torch", "sort": "chips,-seq_len", "limit": 4}
    first = client.get("/api/results", params=params).json()
    second = client.get("/api/results", params={**params, "offset": 4}).json()
    assert first["count"] == second["count"] == 15
    got = keys(first) + keys(second)
    assert [k[2:] for k in got] == [(1, 256), (1, 128), (1, 64), (2, 256), (2, 256), (2, 128),
                                    (2, 128), (2, 64)]
    assert len(set(got)) == 8  # pages do not overlap
    mfu = client.get("/api/results", params={"sort": "mfu", "limit": 100}).json()
    assert [t["mfu"] for t in mfu["data"]] == sorted(t["mfu"] for t in mfu["data"])


def test_csv_has_a_header_and_one_line_per_result(client, seeded):
    r = client.get("/api/results", params={"format": "csv", "mode": "p2p"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(r.text)))
    assert len(rows) == int(r.headers["x-total-count"]) == 2 * 3 + 1
    assert {"tokens_per_s_per_chip", "mfu", "peak_memory_bytes_per_chip", "accelerator",
            "versions", "param_sharding", "remat", "cp_comm_bytes_per_step_per_chip",
            "grad_sync_bytes_per_step_per_chip", *NEW_FIELDS} <= set(rows[0])
    # The CP and weight-sync bytes are stored apart and sum to the total.
    assert all(int(r["cp_comm_bytes_per_step_per_chip"]) + int(r["grad_sync_bytes_per_step_per_chip"])
               == int(r["comm_bytes_per_step_per_chip"]) for r in rows)
    assert rows[0]["versions"] == '{"torch": "2.13.0"}' and rows[0]["mode"] == "p2p"
    limited = client.get("/api/results", params={"format": "csv", "limit": 2}).text
    assert len(limited.strip().splitlines()) == 3


@pytest.mark.parametrize("params, loc, needle", [
    ({"sort": "-speed"}, ["query", "sort"], "tokens_per_s_per_chip"),
    ({"mode": "ring"}, ["query", "mode", 0],
     "'none', 'ulysses', 'p2p', 'all_gather' or 'log_scan'"),
    ({"seq_len_min": 512, "seq_len_max": 64}, ["query"], "seq_len_min=512 is larger"),
    ({"format": "xml"}, ["query", "format"], "'json' or 'csv'"),
    ({"chip": 2}, ["query", "chip"], "Extra inputs are not permitted"),
    ({"remat": "some"}, ["query", "remat", 0], "'none', 'full' or 'gdn'"),
    ({"repeat": -1}, ["query", "repeat", 0], "greater than or equal to 0"),
    ({"repeat": "first"}, ["query", "repeat", 0], "valid integer"),
], ids=["sort", "mode", "range", "format", "unknown", "remat", "repeat-negative", "repeat-text"])
def test_bad_parameters_are_422_naming_them(client, params, loc, needle):
    r = client.get("/api/results", params=params)
    assert r.status_code == 422
    assert any(e["loc"] == loc and needle in e["msg"] for e in r.json()["detail"]), r.json()


def test_results_carry_the_spread_memory_kinds_baseline_and_attempts(client, seeded):
    (gpu,) = client.get("/api/results", params={"framework": "jax"}).json()["data"]
    assert (gpu["step_time_min_s"], gpu["step_time_s"], gpu["step_time_max_s"]) == \
        pytest.approx((0.018, 0.02, 0.022))
    assert gpu["measured_steps"] == 1 and gpu["compile_time_s"] == 2.0
    assert (gpu["peak_flops_dtype"], gpu["device_name"]) == ("bfloat16", "seed cpu")
    # Measured, estimated and predicted memory are three fields, never one in another's place.
    assert (gpu["peak_memory_bytes_per_chip"], gpu["memory_source"]) == (1024_000,
                                                                        "process_rss_hwm")
    assert (gpu["estimated_memory_bytes_per_chip"], gpu["estimated_memory_source"]) == \
        (2048_000, "xla_memory_analysis")
    assert gpu["predicted_memory_bytes_per_chip"] == 1536_000
    (attempt,) = gpu["attempt_history"]
    assert (attempt["attempt"], attempt["status"], attempt["hosts"]) == (1, "succeeded", ["h1"])
    assert attempt["started_at"].startswith("2027-01-01")
    assert gpu["baseline_key"] is None and gpu["scaling_efficiency"] is None  # no chips=1 there

    page = client.get("/api/results", params={"framework": "torch", "seq_len_min": 128,
                                              "seq_len_max": 128}).json()["data"]
    by_point = {(t["mode"], t["chips"]): t for t in page}
    baseline = by_point[("none", 1)]
    assert baseline["baseline_key"] is None and baseline["estimated_memory_bytes_per_chip"] is None
    for point in (("all_gather", 2), ("all_gather", 4), ("p2p", 2), ("p2p", 4)):
        t = by_point[point]  # every mode's rows name the one baseline
        assert t["baseline_key"] == baseline["key"]
        assert t["baseline_trial_id"] == baseline["id"]
        # tokens/s/chip = 128 / chips (+100 for p2p); the baseline's is 128
        assert t["scaling_efficiency"] == pytest.approx(t["tokens_per_s_per_chip"] / 128)
        assert t["speedup_vs_one_chip"] == pytest.approx(t["scaling_efficiency"] * t["chips"])
    trial = client.get(f"/api/trials/{by_point[('p2p', 2)]['id']}").json()
    assert trial.pop("environment") is None  # the detail adds the environment (none seeded)
    assert trial == by_point[("p2p", 2)]


def test_repeats_are_separate_rows_filtered_by_repeat(client, session_factory):
    seed_sweep(session_factory, name="rep", modes=["p2p"], chips=[1, 2], seq_lens=[64],
               repeats=3)
    page = client.get("/api/results", params={"sort": "repeat,chips"}).json()
    assert [(t["repeat"], t["mode"], t["chips"]) for t in page["data"]] == [
        (r, mode, chips) for r in range(3) for mode, chips in (("none", 1), ("p2p", 2))]
    assert all(t["key"].endswith(f"/repeat={t['repeat']}") for t in page["data"])
    # repeat r of a point refers to repeat r of its baseline
    assert all(t["baseline_key"].endswith(f"/repeat={t['repeat']}")
               for t in page["data"] if t["chips"] == 2)
    second = client.get("/api/results", params={"repeat": 1}).json()
    assert {(t["mode"], t["repeat"]) for t in second["data"]} == {("none", 1), ("p2p", 1)}
    both = client.get("/api/results", params={"repeat": [0, 2], "mode": "p2p"}).json()
    assert sorted(t["repeat"] for t in both["data"]) == [0, 2]
    csv_rows = list(csv.DictReader(io.StringIO(client.get(
        "/api/results", params={"format": "csv", "repeat": 2}).text)))
    assert {r["repeat"] for r in csv_rows} == {"2"}
    assert json.loads(csv_rows[0]["attempt_history"])[0]["hosts"] == ["h1"]


def test_retried_trials_appear_once_with_every_attempt_in_order(client, session_factory):
    """Results, a sweep's trials and one trial are read with their attempts in one statement
    (a row per attempt): a trial tried 3 times is one row, its 3 attempts in order, and paging
    counts trials, not attempts."""
    sweep_id = seed_sweep(session_factory, name="retried", modes=["p2p"], chips=[1, 2, 4],
                          seq_lens=[64, 128], attempts_of=lambda t: 3 if t.chips == 2 else 1)

    def history(trial) -> list[tuple]:
        return [(a["attempt"], a["status"], a["hosts"]) for a in trial["attempt_history"]]

    retried = [(1, "timeout", ["h1"]), (2, "timeout", ["h2"]), (3, "succeeded", ["h3"])]
    pages = [client.get("/api/results", params={"sort": "seq_len,chips", "limit": 2,
                                                "offset": offset}).json()
             for offset in (0, 2, 4)]
    assert [p["count"] for p in pages] == [6, 6, 6]
    rows = [t for p in pages for t in p["data"]]
    assert [(t["seq_len"], t["chips"]) for t in rows] == [
        (64, 1), (64, 2), (64, 4), (128, 1), (128, 2), (128, 4)]
    for t in rows:
        assert history(t) == (retried if t["chips"] == 2 else [(1, "succeeded", ["h1"])])
        assert t["attempts"] == len(t["attempt_history"])
    trials = client.get(f"/api/sweeps/{sweep_id}/trials", params={"limit": 3}).json()
    assert trials["count"] == 6 and len(trials["data"]) == 3
    assert [len(t["attempt_history"]) for t in trials["data"]] == [
        3 if t["chips"] == 2 else 1 for t in trials["data"]]
    one = next(t for t in rows if t["chips"] == 2)
    detail = client.get(f"/api/trials/{one['id']}").json()
    assert detail.pop("environment") is None and detail == one
    csv_rows = list(csv.DictReader(io.StringIO(client.get(
        "/api/results", params={"format": "csv", "chips": 2}).text)))
    assert len(csv_rows) == 2
    assert [a["hosts"] for a in json.loads(csv_rows[0]["attempt_history"])] == [
        ["h1"], ["h2"], ["h3"]]


def test_hybrid_dimensions_are_filters_columns_and_csv_fields(client, session_factory):
    seed_sweep(session_factory, name="hy", frameworks=["torch"], modes=["p2p"],
               layers=["gdn_only", "hybrid"], attn_cps=["ring", "all_gather_kv"],
               layouts=["contiguous", "zigzag"], chips=[1, 2], seq_lens=[64])
    every = client.get("/api/results", params={"limit": 100}).json()
    # gdn_only: baseline + 2 layouts; hybrid: baseline + 2 attn_cps × 2 layouts
    assert every["count"] == 3 + 5
    ring = client.get("/api/results", params={"attn_cp": "ring", "layout": "zigzag"}).json()
    (row,) = ring["data"]
    assert (row["layers"], row["attn_cp"], row["layout"], row["chips"]) == (
        "hybrid", "ring", "zigzag", 2)
    assert row["key"].endswith("/layers=hybrid/attn_cp=ring/layout=zigzag")
    gdn = client.get("/api/results", params={"layers": "gdn_only"}).json()
    assert gdn["count"] == 3 and {t["attn_cp"] for t in gdn["data"]} == {None}
    hybrid = client.get("/api/results", params={"layers": "hybrid", "sort": "attn_cp,layout",
                                                "chips": 2}).json()
    assert [(t["attn_cp"], t["layout"]) for t in hybrid["data"]] == [
        ("all_gather_kv", "contiguous"), ("all_gather_kv", "zigzag"), ("ring", "contiguous"),
        ("ring", "zigzag")]
    rows = list(csv.DictReader(io.StringIO(client.get(
        "/api/results", params={"format": "csv", "layers": "hybrid", "chips": 1}).text)))
    assert [(r["layers"], r["attn_cp"], r["layout"], r["mode"]) for r in rows] == [
        ("hybrid", "", "contiguous", "none")]
    bad = client.get("/api/results", params={"attn_cp": "striped"})
    assert bad.status_code == 422 and "attn_cp" in bad.text and "ring" in bad.text


def test_kernels_are_a_filter_a_column_and_stored_with_what_they_resolved_to(
        client, session_factory):
    """Reference and fused rows side by side (seed.py labels the resolved kernels); a fused
    point the workers could not serve is a skipped trial with the reason, and no result."""
    sweep = seed_sweep(session_factory, name="k", frameworks=["torch", "jax"], modes=["p2p"],
                       kernels=["reference", "fused"], chips=[2], seq_lens=[64],
                       status_of=lambda t: "skipped" if (t.framework, t.kernels) == (
                           "torch", "fused") else "succeeded")
    assert client.get("/api/results").json()["count"] == 3
    (row,) = client.get("/api/results", params={"kernels": "fused"}).json()["data"]
    assert (row["framework"], row["kernels"], row["gdn_kernel"], row["attention_kernel"]) == (
        "jax", "fused", "seed fused jax gdn", None)
    assert row["key"].endswith("/remat=none/kernels=fused")
    reference = client.get("/api/results", params={"kernels": "reference",
                                                   "sort": "framework"}).json()["data"]
    assert [(t["framework"], t["key"].endswith("/remat=none")) for t in reference] == [
        ("jax", True), ("torch", True)]
    rows = list(csv.DictReader(io.StringIO(client.get(
        "/api/results", params={"format": "csv", "sort": "kernels,framework"}).text)))
    assert [(r["kernels"], r["framework"], r["gdn_kernel"]) for r in rows] == [
        ("fused", "jax", "seed fused jax gdn"), ("reference", "jax", "seed reference jax gdn"),
        ("reference", "torch", "seed reference torch gdn")]
    trials = client.get(f"/api/sweeps/{sweep}/trials").json()["data"]
    (skipped,) = [t for t in trials if t["status"] == "skipped"]
    assert (skipped["framework"], skipped["kernels"], skipped["error"]) == ("torch", "fused",
                                                                             "boom")
    assert client.get(f"/api/sweeps/{sweep}").json()["spec"]["kernels"] == ["reference", "fused"]
    assert client.get("/api/options").json()["kernels"] == ["reference", "fused"]
    bad = client.get("/api/results", params={"kernels": "turbo"})
    assert bad.status_code == 422 and "kernels" in bad.text and "fused" in bad.text


def test_dp_is_a_filter_a_sort_key_a_column_and_a_csv_field(client, session_factory):
    """chips 2 and 4 split by dp 1 and 2: the meshes 2, 2 = 2×1 (pure data parallel, mode
    none, run once), 4 and 4 = 2×2; batch_size per replica, the global batch beside it."""
    sweep = seed_sweep(session_factory, name="dp", modes=["p2p"], chips=[2, 4], dp=[1, 2],
                       seq_lens=[64], batch_size=2)
    assert client.get("/api/results").json()["count"] == 4
    replicated = client.get("/api/results", params={"dp": 2, "sort": "chips"}).json()["data"]
    assert [(t["mode"], t["chips"], t["dp"], t["batch_size"], t["global_batch_size"])
            for t in replicated] == [("none", 2, 2, 2, 4), ("p2p", 4, 2, 2, 4)]
    assert [t["key"].split("/")[2:4] for t in replicated] == [["chips=2", "dp=2"],
                                                             ["chips=4", "dp=2"]]
    (single,) = client.get("/api/results", params={"dp": 1, "chips": 4}).json()["data"]
    assert (single["dp"], single["global_batch_size"]) == (1, 2)
    assert "/dp=" not in single["key"]  # dp 1 keys are as they were before dp existed
    both = client.get("/api/results", params=[("dp", 1), ("dp", 2), ("chips", 4)]).json()
    assert both["count"] == 2
    rows = list(csv.DictReader(io.StringIO(client.get(
        "/api/results", params={"format": "csv", "sort": "-dp,chips"}).text)))
    assert [(r["chips"], r["dp"], r["batch_size"], r["global_batch_size"]) for r in rows] == [
        ("2", "2", "2", "4"), ("4", "2", "2", "4"), ("2", "1", "2", "2"), ("4", "1", "2", "2")]
    header = list(rows[0])
    assert header.index("dp") == header.index("chips") + 1
    assert header.index("global_batch_size") == header.index("batch_size") + 1
    trials = client.get(f"/api/sweeps/{sweep}/trials").json()["data"]
    assert sorted((t["chips"], t["dp"]) for t in trials) == [(2, 1), (2, 2), (4, 1), (4, 2)]
    assert client.get(f"/api/sweeps/{sweep}").json()["spec"]["dp"] == [1, 2]
    assert "dp" in client.get("/api/options").json()["result_sort_fields"]
    bad = client.get("/api/results", params={"dp": "two"})
    assert bad.status_code == 422 and "dp" in bad.text


def test_gdn_sweep_results_filters_by_dp_given_as_a_comma_list(db_url, session_factory,
                                                               capfd):
    from service.cli.main import main as gdn_sweep

    seed_sweep(session_factory, name="dp", modes=["p2p"], chips=[2, 4], dp=[1, 2],
               seq_lens=[64])
    capfd.readouterr()
    assert gdn_sweep(["results", "--db", db_url, "--dp", "1,2", "--chips", "4", "--csv",
                      "--sort", "dp"]) == 0
    rows = list(csv.DictReader(io.StringIO(capfd.readouterr().out)))
    assert [(r["chips"], r["dp"], r["mode"]) for r in rows] == [("4", "1", "p2p"),
                                                               ("4", "2", "p2p")]
    assert gdn_sweep(["results", "--db", db_url, "--dp", "2"]) == 0
    table = capfd.readouterr().out.splitlines()
    assert table[0].split()[6:10] == ["chips", "dp", "seq_len", "batch"]
    assert "global_batch" in table[0] and table[-1] == "2 of 2 succeeded trial(s) matching"
    with pytest.raises(SystemExit):
        gdn_sweep(["results", "--db", db_url, "--dp", "two"])
    assert "not a comma-separated list of integers" in capfd.readouterr().err


def test_documents_are_a_filter_a_sort_key_a_column_and_a_csv_field(client, session_factory):
    """A sweep over single and packed documents: each packed trial's key ends /documents=…
    (single keys are as they were), its row and CSV line say how it was packed."""
    sweep = seed_sweep(session_factory, name="packed", modes=["p2p"], chips=[1, 2],
                       seq_lens=[64], documents=["single", "uniform:8-24"])
    assert client.get("/api/results").json()["count"] == 4
    packed = client.get("/api/results", params={"documents": "uniform:8-24",
                                                "sort": "chips"}).json()["data"]
    assert [(t["mode"], t["chips"], t["documents"]) for t in packed] == [
        ("none", 1, "uniform:8-24"), ("p2p", 2, "uniform:8-24")]
    assert all(t["key"].endswith("/documents=uniform:8-24") for t in packed)
    assert packed[1]["baseline_trial_id"] == packed[0]["id"]  # the packed one chip
    single = client.get("/api/results", params={"documents": "single"}).json()["data"]
    assert {t["documents"] for t in single} == {"single"}
    assert not any("/documents=" in t["key"] for t in single)
    rows = list(csv.DictReader(io.StringIO(client.get(
        "/api/results", params={"format": "csv", "sort": "documents,chips"}).text)))
    assert [(r["chips"], r["documents"]) for r in rows] == [
        ("1", "single"), ("2", "single"), ("1", "uniform:8-24"), ("2", "uniform:8-24")]
    header = list(rows[0])
    assert header.index("documents") == header.index("kernels") + 1
    trials = client.get(f"/api/sweeps/{sweep}/trials").json()["data"]
    assert sorted(t["documents"] for t in trials) == ["single"] * 2 + ["uniform:8-24"] * 2
    assert client.get(f"/api/sweeps/{sweep}").json()["spec"]["documents"] == [
        "single", "uniform:8-24"]
    assert "documents" in client.get("/api/options").json()["result_sort_fields"]


def test_gdn_sweep_results_filters_by_documents_and_shows_the_column(db_url, session_factory,
                                                                     capfd):
    from service.cli.main import main as gdn_sweep

    seed_sweep(session_factory, name="packed", modes=["p2p"], chips=[2], seq_lens=[64],
               documents=["single", "uniform:8-24"])
    capfd.readouterr()
    assert gdn_sweep(["results", "--db", db_url, "--documents", "uniform:8-24", "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capfd.readouterr().out)))
    assert [(r["chips"], r["documents"]) for r in rows] == [("2", "uniform:8-24")]
    assert gdn_sweep(["results", "--db", db_url, "--documents", "single",
                      "--documents", "uniform:8-24"]) == 0
    table = capfd.readouterr().out.splitlines()
    assert "documents" in table[0].split() and table[-1] == "2 of 2 succeeded trial(s) matching"
    assert sorted("uniform:8-24" in line for line in table[1:-1]) == [False, True]
    assert gdn_sweep(["results", "--db", db_url, "--documents", "uniform:9"]) == 2
    assert "documents='uniform:9' is not single" in capfd.readouterr().err
