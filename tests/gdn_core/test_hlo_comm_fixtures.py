"""The HLO comm-bytes parser on saved GPU and TPU HLO text (we cannot compile for them here).

Each fixture under fixtures/hlo/ says in its header which XLA / JAX text it is built on. The
expected bytes are computed by hand below from the formulas in gdn_core/jax_gdn/hlo_comm.py:
all-gather (G−1)·S, all-to-all and reduce-scatter (G−1)/G·S, all-reduce 2·(G−1)/G·S,
collective-permute / recv S per target chip, with S the operand bytes and G the group size.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gdn_core.jax_gdn.hlo_comm import received_bytes_per_chip, shape_bytes

FIXTURES = Path(__file__).parent / "fixtures" / "hlo"
F32, BF16 = 4, 2


def load(name: str) -> str:
    return (FIXTURES / name).read_text()


def by_op(comm) -> dict[str, list[dict]]:
    ops: dict[str, list[dict]] = {}
    for op in comm["ops"]:
        ops.setdefault(op["op"], []).append(op)
    return ops


@pytest.mark.timeout(30)
def test_gpu_async_start_done_pairs_counted_once():
    comm = received_bytes_per_chip(load("gpu_async_collectives.hlo"), 4)
    ops = by_op(comm)
    # One entry per collective: -done halves and the async-done of the wrapped all-to-all are
    # not collectives of their own.
    assert sorted(ops) == ["all-gather", "all-reduce", "all-to-all", "collective-permute",
                           "reduce-scatter"]
    assert all(len(v) == 1 for v in ops.values()), comm["ops"]
    ag = 2 * 4 * 64 * 64 * F32            # f32[2,4,64,64] shard, groups [1,4]<=[4]
    a2a = 2 * 64 * 4 * 64 * F32           # f32[2,64,4,64], one group of 4, in %wrapped_...
    rs = 512 * 128 * BF16                 # bf16[512,128] before the scatter
    ar = 128 * F32 + F32                  # combined (f32[128], f32[]), groups {0,1},{2,3}
    cp = 2 * 4 * 64 * 64 * F32            # per trip of the 3-trip while, to chips 1, 2, 3
    assert ops["all-gather"][0]["operand_bytes"] == ag
    assert ops["all-to-all"][0]["operand_bytes"] == a2a
    assert ops["reduce-scatter"][0]["operand_bytes"] == rs
    assert ops["all-reduce"][0]["operand_bytes"] == ar
    assert ops["all-reduce"][0]["groups"] == [[0, 1], [2, 3]]
    assert ops["collective-permute"][0]["times"] == 3
    every_chip = 3 * ag + a2a * 3 // 4 + rs * 3 // 4 + 2 * ar // 2
    assert comm["per_chip"] == [every_chip] + [every_chip + 3 * cp] * 3
    assert comm["per_chip"] == [590340, 983556, 983556, 983556]


@pytest.mark.timeout(30)
def test_tpu_tiled_layouts_operand_shapes_multiline():
    """Operands printed with TPU tiled layouts (parentheses inside the operand list),
    instructions over several lines, names reused across computations."""
    comm = received_bytes_per_chip(load("tpu_tiled_operand_shapes.hlo"), 4)
    ops = by_op(comm)
    assert sorted(ops) == ["all-gather", "all-reduce", "all-to-all", "collective-permute",
                           "reduce-scatter"]
    ag = 8 * 256 * 256 * F32              # f32[8,256,256]{2,1,0:T(8,128)S(1)}
    ar = 2 * 8 * 256 * 256 * F32          # f32[2,8,256,256], written over two lines
    a2a = 4 * (4 * 128 * BF16)            # four bf16[4,128] operands
    rs = 64 * 128 * BF16
    cp = 8 * 256 * BF16                   # the body's %gte.1, not ENTRY's bf16[4,128] %gte.1
    assert [op["operand_bytes"] for op in comm["ops"]] == [cp, ag, ar, a2a, rs]
    assert ops["all-to-all"][0]["groups"] == [[0, 2], [1, 3]]   # [2,2]<=[2,2]T(1,0)
    assert ops["collective-permute"][0]["times"] == 3
    every_chip = 3 * ag + 2 * ar // 2 + a2a // 2 + rs * 3 // 4 + 3 * cp
    assert comm["per_chip"] == [every_chip] * 4 == [10512384] * 4


@pytest.mark.timeout(30)
def test_tpu_as_text_async_chain_and_loop():
    comm = received_bytes_per_chip(load("tpu_as_text_async.hlo"), 8)
    ops = by_op(comm)
    assert sorted(ops) == ["all-gather", "all-reduce", "collective-permute", "reduce-scatter"]
    assert all(len(v) == 1 for v in ops.values()), comm["ops"]
    ag = 1 * 512 * 8 * 128 * BF16         # bf16[1,512,8,128]{3,2,1,0:T(8,128)(2,1)S(1)}
    rs = 8 * 1024 * F32                   # inside %async_computation.1 (start/update/done)
    cp = 8 * 128 * 128 * F32              # 7 trips, to chips 1..7
    ar = F32                              # the scalar loss psum
    assert ops["collective-permute"][0]["times"] == 7
    assert not ops["collective-permute"][0]["trip_count_unknown"]
    every_chip = 7 * ag + rs * 7 // 8 + 2 * 7 * ar // 8
    assert comm["per_chip"] == [every_chip] + [every_chip + 7 * cp] * 7
    assert comm["per_chip"] == [7368711] + [11038727] * 7
    assert comm["max_bytes"] == 11038727


@pytest.mark.timeout(30)
def test_gpu_pipelined_send_recv():
    """A collective-permute decomposed into send / recv: bytes counted at the recv, per
    target of _xla_send_recv_source_target_pairs; the host transfer moves nothing."""
    comm = received_bytes_per_chip(load("gpu_pipelined_send_recv.hlo"), 4)
    (recv,) = comm["ops"]
    data = 2 * 4 * 64 * 64 * F32
    assert recv["op"] == "recv" and recv["operand_bytes"] == data and recv["times"] == 3
    assert comm["per_chip"] == [0, 3 * data, 3 * data, 3 * data]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("shape, expected", [
    ("f32[8,128]{1,0:T(8,128)}", 8 * 128 * 4),
    ("bf16[14,40,100,16]{0,3,2,1:T(8,128)(2,1)S(1)}", 14 * 40 * 100 * 16 * 2),
    ("(f32[8]{0}, /*index=1*/bf16[2,4]{1,0}, u32[]{:T(128)}, token[])", 32 + 16 + 4),
    ("f32[1, 1024, 1024]", 1024 * 1024 * 4),           # XLA test text puts spaces in dims
    ("f32[<=16,8]{1,0}", 16 * 8 * 4),                   # a bounded dynamic dim: its bound
], ids=lambda v: v if isinstance(v, str) else None)
def test_shape_bytes(shape, expected):
    assert shape_bytes(shape) == expected


@pytest.mark.timeout(30)
def test_unsized_operand_is_an_error():
    text = """HloModule m, num_partitions=2
ENTRY %main {
  %ag = f32[8]{0} all-gather(%missing), replica_groups={{0,1}}, dimensions={0}
}
"""
    with pytest.raises(ValueError, match=r"operand %missing of all-gather %ag"):
        received_bytes_per_chip(text, 2)


def test_index_comments_in_long_operand_lists_are_not_shapes():
    # XLA prints /*index=5*/ before every fifth element of long tuples and operand lists (the
    # gradient all-reduce of a real step): read as a "printed shape" it sized operands as 0.
    hlo = """HloModule m, entry_computation_layout={()->f32[]}

region_add {
  a = f32[] parameter(0)
  b = f32[] parameter(1)
  ROOT s = f32[] add(a, b)
}

ENTRY main {
  p0 = f32[4]{0} parameter(0)
  p1 = f32[4]{0} parameter(1)
  p2 = f32[4]{0} parameter(2)
  p3 = f32[4]{0} parameter(3)
  p4 = f32[4]{0} parameter(4)
  p5 = f32[8,2]{1,0} parameter(5)
  ar = (f32[4]{0}, f32[4]{0}, f32[4]{0}, f32[4]{0}, f32[4]{0}, /*index=5*/f32[8,2]{1,0}) all-reduce(p0, p1, p2, p3, p4, /*index=5*/p5), channel_id=1, replica_groups={{0,1}}, use_global_device_ids=true, to_apply=region_add
  ROOT r = f32[] constant(0)
}
"""
    operand_bytes = 5 * 4 * 4 + 8 * 2 * 4
    assert received_bytes_per_chip(hlo, 2)["per_chip"] == [operand_bytes] * 2  # 2·(G−1)/G·S
