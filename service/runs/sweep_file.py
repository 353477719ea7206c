"""Sweep files for `gdn-sweep run` and `gdn-sweep schedule`: a sweep YAML read with the API's
checks (`load_spec`), and the JSON-lines results file a `--jsonl` run writes (`jsonl_target`).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from pydantic import ValidationError

from service.runs.admission import grid_cap_error, key_problem, model_problem, validation_text
from workers.result_sink import JsonLinesError, read_jsonl, read_text
from workers.sweep_spec import SweepSpec


class SweepFileError(ValueError):
    """A sweep file that cannot be run; str() is the message to show (it names the file)."""


def load_spec(path: str | Path, *, grid_cap: int | None = None) -> SweepSpec:
    """Read a sweep YAML (or JSON) file into the API's SweepSpec, with the API's checks: the
    spec, the grid cap (when given) and the model's presets. SweepFileError if any fails."""
    import yaml

    text = read_text(path, SweepFileError)
    try:
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as err:
        mark, context = err.problem_mark or err.context_mark, ""
        where = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        if err.problem and err.context and err.context_mark is not None:
            context = f" ({err.context} at line {err.context_mark.line + 1})"
        raise SweepFileError(f"{path}{where}: not valid YAML: "
                             f"{err.problem or err.context}{context}") from None
    except yaml.YAMLError as err:
        raise SweepFileError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        held = "nothing" if data is None else f"a {type(data).__name__}"
        raise SweepFileError(f"{path}: a sweep is a YAML mapping (name: …, frameworks: […], "
                             f"…); this file holds {held}")
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as err:
        raise SweepFileError(f"{path}: not a valid sweep:\n{validation_text(err)}") from None
    too_large = None if grid_cap is None else grid_cap_error(spec, grid_cap)
    if too_large is not None:
        raise SweepFileError(f"{path}: {too_large['msg']}")
    problem = model_problem(spec)  # what POST /api/sweeps refuses: a model the presets
    if problem is not None:        # cannot build, a trial key longer than its column
        raise SweepFileError(f"{path}: model: {problem}")
    problem = key_problem(spec)
    if problem is not None:
        raise SweepFileError(f"{path}: documents: {problem}")
    return spec


class ResultsFileError(ValueError):
    """A results file or folder that cannot take this sweep; str() is the one-line reason."""


def jsonl_target(spec: SweepSpec, target: str | None, *, new: bool,
                 now: dt.datetime | None = None) -> tuple[Path, bool]:
    """(the file this run writes, whether it is a new file) for `--jsonl target`:

    - a folder (one that exists, or a path ending in /): a new file per run,
      `<folder>/<name>-<UTC time>.jsonl` (a scheduled run gets its own file and sweep);
    - a file: a new one is made; an existing one holding this very sweep is resumed, unless
      `new` (then refused: one file holds one sweep); one holding another sweep is refused;
    - None: `<name>.jsonl` here, as a file.
    The folder must exist: ResultsFileError otherwise, before anything runs."""
    path = Path(target if target is not None else f"{spec.name}.jsonl")
    if target is not None and (target.endswith(("/", "\\")) or path.is_dir()):
        if not path.is_dir():
            raise ResultsFileError(f"--jsonl {target}: no such folder")
        stamp = (now or dt.datetime.now(dt.UTC)).strftime("%Y%m%dT%H%M%SZ")
        candidate, n = path / f"{spec.name}-{stamp}.jsonl", 1
        while candidate.exists():
            n += 1
            candidate = path / f"{spec.name}-{stamp}-{n}.jsonl"
        return candidate, True
    if not path.parent.is_dir():
        raise ResultsFileError(f"--jsonl {path}: the folder {path.parent} does not exist")
    if not path.exists():
        return path, True
    try:
        held = read_jsonl(path)
    except JsonLinesError as err:
        raise ResultsFileError(str(err)) from None
    if held.header is None:
        raise ResultsFileError(f"{path}: holds results without a sweep header (written by an "
                               f"older gdn-sweep); give another file or a folder")
    if new:
        raise ResultsFileError(f"{path} already holds sweep {held.header['uid']} "
                               f"({held.header['name']!r}); continue it with --resume {path}, "
                               f"or give a folder (--jsonl DIR/) for a new file per run")
    if held.spec.model_dump(mode="json") != spec.model_dump(mode="json"):
        raise ResultsFileError(f"{path} holds another sweep ({held.header['name']!r}, another "
                               f"spec); give another file, or a folder for a new file per run")
    return path, False
