"""The sweep the top-level README shows (the body of POST /api/sweeps, the YAML of `gdn-sweep
run`) is a valid SweepSpec whose grid is the size the README states."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from workers.sweep_spec import SweepSpec

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_sweep_validates_with_the_stated_grid():
    text = README.read_text()
    body = re.search(r"A sweep \(the body of `POST /api/sweeps`.*?```yaml\n(.*?)```", text,
                     re.S)
    assert body, "README: the sweep example is gone"
    spec = SweepSpec.model_validate(yaml.safe_load(body.group(1)))
    stated = re.search(r"this grid: [^=]*= (\d+) trials", text)
    assert stated and spec.grid_size == int(stated.group(1)), (spec.grid_size, stated)
    # every grid dimension of the spec appears in the example
    for dimension in ("frameworks", "layers", "modes", "attn_cps", "layouts", "chips",
                      "seq_lens", "dtypes", "param_shardings", "remats"):
        assert re.search(rf"^{dimension}:", body.group(1), re.M), dimension
