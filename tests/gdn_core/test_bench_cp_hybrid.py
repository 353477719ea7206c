"""`bench cp --layers hybrid`: the analytic hybrid table, labelled so."""

from gdn_core.attention_flops import attention_imbalance
from gdn_core.bench.cp import main
from gdn_core.presets import get_preset


def test_hybrid_table_labels_analytic_figures_and_shows_zigzag_balancing(capsys):
    assert main(["--layers", "hybrid", "--preset", "tiny", "--chips", "1", "2", "8",
                 "--local-tokens", "64", "--modes", "p2p", "--attn-cps", "ring",
                 "ulysses"]) == 0
    out = capsys.readouterr().out
    assert "ALL FIGURES ANALYTIC" in out and "1 GDN + 1 gated-attention layers" in out
    rows = {tuple(line.split()[:3]): line.split() for line in out.splitlines()
            if line.split()[:1] in (["p2p"], ["none"])}
    assert ("none", "-", "1") in rows
    ring8 = rows[("p2p", "ring", "8")]
    # contiguous: the last chip does about 2D − 1 times the first's attention; zigzag: equal
    assert float(ring8[-2]) == round(attention_imbalance(chips=8, seq_len=512,
                                                         layout="contiguous"), 3)
    assert 14 < float(ring8[-2]) < 15 and float(ring8[-1]) == 1.0
    # tiny's attention has 4 query heads: ulysses attention cannot split them over 8 chips
    assert "skipped: attn_cp='ulysses' needs query heads (4)" in out
    assert get_preset("tiny", layers="hybrid").attention.num_heads == 4
