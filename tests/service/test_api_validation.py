"""Bad input is a 422 naming the field, never a 5xx, and writes nothing; SQLite and PostgreSQL
answer alike (PostgreSQL's Integer columns are int32, SQLite's int64)."""

from __future__ import annotations

import json

import pytest

from service.api.errors import INPUT_CHARS, MAX_ERRORS, safe_errors

from .conftest import TINY_SWEEP
from .test_api_sweeps import row_counts, sweep_body

INT32_MAX = 2 ** 31 - 1
JSON = {"content-type": "application/json"}


def raw_body(**fragments: str) -> bytes:
    """TINY_SWEEP as JSON text with the given fields spliced in as raw JSON (NaN, escapes…)."""
    text = json.dumps(TINY_SWEEP)[:-1]
    return (text + "".join(f', "{k}": {v}' for k, v in fragments.items()) + "}").encode()


def assert_422_naming(response, loc: list, needle: str = "") -> list[dict]:
    assert response.status_code == 422, response.text
    errors = response.json()["detail"]
    assert any(e["loc"] == loc and needle in e["msg"] for e in errors), errors
    return errors


@pytest.mark.parametrize("method, url, loc", [
    ("get", f"/api/sweeps/{INT32_MAX + 1}", ["path", "sweep_id"]),
    ("get", f"/api/sweeps/{INT32_MAX + 1}/trials", ["path", "sweep_id"]),
    ("post", f"/api/sweeps/{INT32_MAX + 1}/cancel", ["path", "sweep_id"]),
    ("get", "/api/sweeps/0", ["path", "sweep_id"]),
    ("get", f"/api/trials/{2 ** 63}", ["path", "trial_id"]),
    ("get", f"/api/sweeps?offset={2 ** 63}", ["query", "offset"]),
    ("get", f"/api/sweeps/1/trials?offset={INT32_MAX + 1}", ["query", "offset"]),
    ("get", f"/api/results?chips={INT32_MAX + 1}", ["query", "chips", 0]),
    ("get", f"/api/results?offset={2 ** 63}", ["query", "offset"]),
    ("get", f"/api/results?sweep_id={INT32_MAX + 1}", ["query", "sweep_id"]),
    ("get", f"/api/results?seq_len_min={INT32_MAX + 1}", ["query", "seq_len_min"]),
    ("get", f"/api/results?repeat={INT32_MAX + 1}", ["query", "repeat", 0]),
    ("get", "/api/results?preset=ti%00ny", ["query", "preset", 0]),
    ("get", "/api/results?device_name=%C2%85", ["query", "device_name", 0]),
], ids=["sweep-id", "sweep-trials-id", "cancel-id", "sweep-id-0", "trial-id", "sweeps-offset",
        "trials-offset", "results-chips", "results-offset", "results-sweep-id",
        "results-seq-len", "results-repeat", "results-nul", "results-c1-control"])
def test_out_of_range_ids_and_filters_are_422(client, session_factory, method, url, loc):
    assert_422_naming(getattr(client, method)(url), loc)
    assert row_counts(session_factory) == (0, 0, 0)


def test_largest_int32_is_accepted_as_an_id_and_an_offset(client):
    # The boundary itself reaches the database: a miss is a 404, a page past the end is empty.
    assert client.get(f"/api/sweeps/{INT32_MAX}").status_code == 404
    assert client.get(f"/api/sweeps/{INT32_MAX}/trials").status_code == 404
    assert client.post(f"/api/sweeps/{INT32_MAX}/cancel").status_code == 404
    assert client.get(f"/api/trials/{INT32_MAX}").status_code == 404
    assert client.get("/api/sweeps", params={"offset": INT32_MAX}).json()["data"] == []
    results = client.get("/api/results", params={"offset": INT32_MAX, "chips": INT32_MAX,
                                                 "seq_len_min": INT32_MAX})
    assert results.status_code == 200 and results.json()["data"] == []


@pytest.mark.parametrize("change, loc, needle", [
    ({"chips": [2660498125]}, ["body", "chips"], "<= 16384"),
    ({"chips": [16385]}, ["body", "chips"], "<= 16384"),
    ({"seq_lens": [1099511627776]}, ["body", "seq_lens"], f"<= {2 ** 30}"),
    ({"chips": [True]}, ["body", "chips", 0], "valid integer"),
    ({"chips": ["2"]}, ["body", "chips", 0], "valid integer"),
    ({"seq_lens": [64.0]}, ["body", "seq_lens", 0], "valid integer"),
    ({"steps": True}, ["body", "steps"], "valid integer"),
    ({"batch_size": "2"}, ["body", "batch_size"], "valid integer"),
    ({"model": {"preset": "tiny", "num_layers": True}}, ["body", "model", "num_layers"],
     "valid integer"),
    ({"verify": "yes"}, ["body", "verify"], "valid boolean"),
    ({"admit_over_memory": 1}, ["body", "admit_over_memory"], "valid boolean"),
    ({"trial_timeout_s": "600"}, ["body", "trial_timeout_s"], "valid number"),
    ({"name": "   "}, ["body", "name"], "blank"),
    ({"name": "a\x00b"}, ["body", "name"], "U+0000, at position 1"),
    ({"name": "tab\there"}, ["body", "name"], "U+0009"),
    ({"name": 7}, ["body", "name"], "valid string"),
    ({"accelerator": {"kind": "gpu", "type": "h100\x00"}}, ["body", "accelerator", "type"],
     "U+0000"),
    ({"model": {"preset": "tiny\x7f"}}, ["body", "model", "preset"], "U+007F"),
], ids=["chips-over-int32", "chips-over-max", "seq-len-over-max", "chips-true", "chips-string",
        "seq-len-float", "steps-true", "batch-string", "num-layers-true", "verify-string",
        "admit-int", "timeout-string", "name-blank", "name-nul", "name-tab", "name-int",
        "accelerator-nul", "preset-del"])
def test_bad_body_values_are_422_naming_the_field(client, session_factory, change, loc, needle):
    assert_422_naming(client.post("/api/sweeps", json=sweep_body(**change)), loc, needle)
    assert row_counts(session_factory) == (0, 0, 0)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity", "1e400"])
def test_non_finite_numbers_are_422_that_renders(client, session_factory, literal):
    # Python's json reads these (1e400 as inf); JSON cannot write them back, so the 422 shows
    # the input as a string.
    shown = "Infinity" if literal == "1e400" else literal
    timeout = client.post("/api/sweeps", content=raw_body(trial_timeout_s=literal), headers=JSON)
    errors = assert_422_naming(timeout, ["body", "trial_timeout_s"])
    assert errors[0]["input"] == shown
    chips = client.post("/api/sweeps", content=raw_body(chips=f"[{literal}]"), headers=JSON)
    assert assert_422_naming(chips, ["body", "chips", 0], "valid integer")[0]["input"] == shown
    assert row_counts(session_factory) == (0, 0, 0)


def test_lone_surrogate_in_name_is_422_naming_it(client, session_factory):
    r = client.post("/api/sweeps", content=raw_body(name='"ab\\udfcc"'), headers=JSON)
    errors = assert_422_naming(r, ["body", "name"], "unpaired surrogate, U+DFCC, at position 2")
    assert errors[0]["input"] == "ab\\udfcc"  # escaped: the response stays valid UTF-8
    # A field named by a lone surrogate: pydantic refuses the key, shown escaped.
    r = client.post("/api/sweeps", content=raw_body(**{"\\ud800": "1"}), headers=JSON)
    assert assert_422_naming(r, ["body"], "unicode string")[0]["input"] == "\\ud800"
    assert row_counts(session_factory) == (0, 0, 0)


@pytest.mark.parametrize("body, needle", [
    (b'{"name": "caf\xe9"}', "not UTF-8"),
    (b"\xff\xfe\x00", "not UTF-8"),
    (b'{"name": ', "JSON decode error"),
    (b'{"chips": [' + b"9" * 5000 + b"]}", "not JSON that can be read"),
], ids=["latin-1", "bad-bytes", "truncated", "huge-integer"])
def test_body_that_is_not_json_or_not_utf8_is_422(client, session_factory, body, needle):
    r = client.post("/api/sweeps", content=body, headers=JSON)
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["type"] == "json_invalid"
    assert needle in r.json()["detail"][0]["msg"]
    assert row_counts(session_factory) == (0, 0, 0)


def test_huge_name_gets_a_small_422(client, session_factory):
    # Under the perimeter's 1 MiB body limit, so the body reaches validation.
    r = client.post("/api/sweeps", json=sweep_body(name="x" * 1_000_000))
    errors = assert_422_naming(r, ["body", "name"], "at most 200 characters")
    assert len(r.content) < 10_000
    assert errors[0]["input"].startswith("x" * INPUT_CHARS + "… (1000000 characters)")
    assert row_counts(session_factory) == (0, 0, 0)


def test_many_bad_items_are_listed_up_to_a_cap(client, session_factory):
    r = client.post("/api/sweeps", json=sweep_body(chips=["2"] * 50_000))
    errors = assert_422_naming(r, ["body", "chips", 0], "valid integer")
    assert len(errors) == MAX_ERRORS + 1 and errors[-1]["type"] == "too_many_errors"
    assert errors[-1]["ctx"]["errors"] == 50_000 and len(r.content) < 10_000
    assert row_counts(session_factory) == (0, 0, 0)


def test_safe_errors_render_any_input_small():
    huge = "y" * 10_000_000
    errors = [{"type": "t", "loc": ("body", huge), "msg": huge, "input": {"name": huge},
               "ctx": {"error": ValueError("\udfcc"), "limit": float("-inf")}},
              {"type": "t", "loc": ("body",), "msg": "m", "input": [float("nan")] * 10**6}]
    text = json.dumps(safe_errors(errors), allow_nan=False, ensure_ascii=False).encode()
    assert len(text) < 5_000
    safe = safe_errors(errors)
    assert safe[0]["ctx"] == {"error": "\\udfcc", "limit": "-Infinity"}
    assert safe[1]["input"].startswith("[nan, nan, nan, nan, ...]")


def test_over_memory_points_are_skipped_with_the_prediction(client, session_factory):
    body = sweep_body(name="27b at 16M tokens", frameworks=["jax"], modes=["all_gather"],
                      chips=[8], seq_lens=[2 ** 24], model={"preset": "qwen3.5-27b"},
                      dtypes=["bfloat16"], accelerator={"kind": "gpu", "type": "h100"})
    r = client.post("/api/sweeps", json=body)
    assert r.status_code == 201, r.text
    assert r.json()["trials"] == 1 and r.json()["skipped"] == 1
    (trial,) = client.get(f"/api/sweeps/{r.json()['id']}/trials").json()["data"]
    assert trial["status"] == "skipped"
    for needle in ("predicted memory", "GiB per chip", "80.0 GiB HBM of one h100 chip",
                   "admit_over_memory: true"):
        assert needle in trial["error"], trial["error"]

    forced = client.post("/api/sweeps", json={**body, "admit_over_memory": True})
    assert forced.status_code == 201 and forced.json()["skipped"] == 0
    (trial,) = client.get(f"/api/sweeps/{forced.json()['id']}/trials").json()["data"]
    assert trial["status"] == "pending" and trial["error"] is None
    stored = client.get(f"/api/sweeps/{forced.json()['id']}").json()["spec"]
    assert stored["admit_over_memory"] is True
    assert row_counts(session_factory) == (2, 2, 1)  # the skipped trial has its result row


def test_unknown_kernels_are_422_naming_the_value_and_what_is_accepted(client, session_factory):
    r = client.post("/api/sweeps", json=sweep_body(kernels=["reference", "bogus"]))
    (error,) = assert_422_naming(r, ["body", "kernels", 1], "'reference' or 'fused'")
    assert error["input"] == "bogus"
    plans = client.post("/api/sweeps", json=sweep_body(frameworks=["jax"], kinds=["plan"],
                                                       kernels=["fused"]))
    assert plans.status_code == 422 and "add 'reference' to kernels" in plans.text
    assert row_counts(session_factory) == (0, 0, 0)


def test_a_dp_dividing_no_chip_count_is_422_naming_it_and_writes_nothing(client,
                                                                         session_factory):
    r = client.post("/api/sweeps", json=sweep_body(chips=[1, 2, 4], dp=[1, 3]))
    assert_422_naming(r, ["body"], "dp=[3] divides none of chips=[1, 2, 4]")
    outside = client.post("/api/sweeps", json=sweep_body(chips=[2], dp=[0]))
    assert_422_naming(outside, ["body", "dp"], "[0]")
    as_text = client.post("/api/sweeps", json=sweep_body(chips=[2], dp=["2"]))
    assert_422_naming(as_text, ["body", "dp", 0], "valid integer")
    scheduled = client.post("/api/schedules", json={
        "name": "nightly dp", "cron": "0 2 * * *", "spec": sweep_body(chips=[2], dp=[4])})
    assert_422_naming(scheduled, ["body", "spec"], "dp=[4] divides none of chips=[2]")
    assert row_counts(session_factory) == (0, 0, 0)


def test_a_bad_documents_value_is_422_naming_it_and_what_is_accepted_and_writes_nothing(
        client, session_factory):
    r = client.post("/api/sweeps", json=sweep_body(documents=["single", "uniform:64-8"]))
    assert_422_naming(r, ["body", "documents", 1], "documents='uniform:64-8': lengths need "
                                                   "1 <= LO <= HI")
    unknown = client.post("/api/sweeps", json=sweep_body(documents="zipf:1.1"))
    assert_422_naming(unknown, ["body", "documents", 0],
                      "documents='zipf:1.1' is not single (one document per sequence) or "
                      "uniform:LO-HI")
    too_long = client.post("/api/sweeps", json=sweep_body(documents=["uniform:" + "1" * 40]))
    assert_422_naming(too_long, ["body", "documents", 0], "at most 40 characters")
    scheduled = client.post("/api/schedules", json={
        "name": "nightly packed", "cron": "0 2 * * *", "spec": sweep_body(documents=["x"])})
    assert_422_naming(scheduled, ["body", "spec", "documents", 0], "documents='x'")
    filtered = client.get("/api/results", params={"documents": "uniform:9"})
    assert_422_naming(filtered, ["query", "documents", 0], "documents='uniform:9'")
    assert row_counts(session_factory) == (0, 0, 0)
