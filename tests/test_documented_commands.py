"""Every command the documents show parses, with the parser that would run it (issue 36: a
documented `gdn-sweep bench api` crashed and nothing noticed).

tests/documented_commands.py collects the commands (the READMEs' code blocks, indented code
lines and inline command spans, and the benchmarks' help texts) and expands their notation
(optional parts, alternatives, placeholders: its docstring states the rules). Each variant is
checked without running anything, by what would run it:
  gdn-sweep ARGS              the CLI's argparse parser, and for `bench NAME` the benchmark's
                              own, reached through the CLI's dispatch (service/cli/main.py)
  python -m MODULE ARGS       MODULE run as `python -m` does (runpy) up to its parse_args;
                              MODULE must be one of PARSED_MODULES (pytest: see below), or
                              another project's, in documented_commands.FOREIGN_MODULES
  python deploy/run_sweep.py  that script, likewise (and `ray submit CONFIG SCRIPT -- ARGS`,
                              `ray job submit … -- COMMAND`: the config exists, then the same)
  bash SCRIPT ARGS            SCRIPT exists; a script that passes "$@" to `python3 -m MODULE`
                              takes ARGS as MODULE does; another takes what its
                              `case "${1:-}"` accepts, one argument at most
  pytest ARGS                 the test files it names exist (its options are pytest's own)
and every word naming a file of the checkout (deploy/…, scripts/…, tests/…) must exist.
What is not checked, and why, is listed in documented_commands.FOREIGN_PROGRAMS and
FOREIGN_RAY_COMMANDS: other projects' programs (docker, kubectl, gcloud, Ray's launcher).
An inline span that names a command without options (`gdn-sweep import`, `gdn-sweep schedule
show`) is a mention: it must name a real command, but may leave out its required arguments.
Running the benchmarks at tiny sizes is the job of their own tests (tests/*/test_bench_*.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import runpy
import shlex
import sys
import warnings

import pytest

from tests.documented_commands import (FOREIGN_MODULES, FOREIGN_PROGRAMS, FOREIGN_RAY_COMMANDS,
                                       ROOT, checkout_paths, collect, variants)

PARSED_MODULES = ("gdn_core.bench", "service.cli", "service.demo", "service.bench.api_load",
                  "gdn_core.jax_gdn.plan")
"""`python -m` modules whose arguments are checked by their own argparse parser."""
PARSED_SCRIPTS = ("deploy/run_sweep.py",)
COMMANDS = collect()


class Parsed(BaseException):
    """Raised where the command would start its work: its arguments parsed."""


@contextlib.contextmanager
def parse_only():
    """argparse stops every command once its arguments are parsed, by raising Parsed: the
    outermost parse_known_args of a command raises it instead of returning, unless arguments
    are left over (its caller refuses them, or gdn-sweep hands them to a benchmark whose own
    parser is stopped in turn)."""
    real = argparse.ArgumentParser.parse_known_args
    depth = 0

    def parse_known_args(self, args=None, namespace=None):
        nonlocal depth
        depth += 1
        try:
            namespace, extras = real(self, args, namespace)
        finally:
            depth -= 1
        if depth or extras or getattr(namespace, "command", None) == "bench":
            return namespace, extras
        raise Parsed()

    argparse.ArgumentParser.parse_known_args = parse_known_args
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_known_args = real


def parse_problem(run, argv: list[str]) -> str | None:
    """None when `run` got as far as its parsed arguments; else what went wrong."""
    err, saved_argv = io.StringIO(), sys.argv
    sys.argv = argv
    try:
        with parse_only(), contextlib.redirect_stderr(err), \
                contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # runpy: module already imported
            run()
    except Parsed:
        return None
    except SystemExit as exit_:
        if exit_.code in (0, None):
            return None  # `--help`: argparse printed the help and exits 0
        return (err.getvalue().strip().splitlines() or [f"exit {exit_.code}"])[-1]
    finally:
        sys.argv = saved_argv
    return "it returned without parsing its arguments"


def problem_of(words: list[str]) -> str | None:
    """Why the command `words` would not run as documented (None: it parses)."""
    missing = [p for p in checkout_paths(words) if not (ROOT / p).exists()]
    if missing:
        return f"no such file in the checkout: {', '.join(missing)}"
    program, args = words[0], words[1:]
    if program == "gdn-sweep":
        from service.cli.main import main

        return parse_problem(lambda: main(args), ["gdn-sweep", *args])
    if program in ("python", "python3") and args[:1] == ["-m"]:
        module = args[1]
        if module == "pytest":
            return None  # pytest's options; its paths are checked above
        if module in FOREIGN_MODULES:
            return None
        if module not in PARSED_MODULES:
            return f"python -m {module}: not in PARSED_MODULES (add it, if it has a parser)"
        return parse_problem(lambda: runpy.run_module(module, run_name="__main__",
                                                      alter_sys=True), [module, *args[2:]])
    if program in ("python", "python3"):
        if args[0] not in PARSED_SCRIPTS:
            return f"python {args[0]}: not in PARSED_SCRIPTS"
        path = str(ROOT / args[0])
        return parse_problem(lambda: runpy.run_path(path, run_name="__main__"), [path, *args[1:]])
    if program == "bash":
        return _script_problem(args[0], args[1:])
    if program == "ray":
        if args[:1] == ["submit"]:  # ray submit CONFIG SCRIPT [--] ARGS: SCRIPT on the head
            rest = [a for a in args[3:] if a != "--"]
            return problem_of(["python", args[2], *rest])
        if args[:2] == ["job", "submit"]:
            return problem_of(args[args.index("--") + 1:])
        if args[0] in FOREIGN_RAY_COMMANDS:
            return None
        return f"ray {args[0]}: neither checked nor in FOREIGN_RAY_COMMANDS"
    if program == "pytest":
        return None
    if program in FOREIGN_PROGRAMS:
        return None
    return f"{program}: neither checked here nor in FOREIGN_PROGRAMS (with why)"


def _script_problem(script: str, args: list[str]) -> str | None:
    path = ROOT / script
    if not path.is_file():
        return f"no script {script}"
    text = path.read_text()
    forwarded = re.search(r'-m (\S+) .*"\$@"', text)
    if forwarded:
        return problem_of(["python", "-m", forwarded.group(1), *args])
    if not args:
        return None
    case = re.search(r'case "\$\{1:-\}" in(.*?)esac', text, re.S)
    accepted = re.findall(r"^\s*([^\s()*]+)\)", case.group(1), re.M) if case else []
    if len(args) > 1 or args[0] not in accepted:
        return f"{script} accepts one of {accepted or 'no arguments'}, not {args}"
    return None


def _is_mention(words: list[str], problem: str) -> bool:
    return ("the following arguments are required" in problem
            and not any(w.startswith("-") for w in words[1:] if w != "-m"))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("command", COMMANDS, ids=[c.id for c in COMMANDS])
def test_documented_command_parses(command):
    for words in variants(command.text):
        problem = problem_of(words)
        if problem and command.inline and _is_mention(words, problem):
            continue
        assert problem is None, f"{command.source}: `{shlex.join(words)}`: {problem}"


def test_the_collector_finds_the_documents_commands():
    texts = {c.text for c in COMMANDS}
    sources = {c.source.split(":")[0] for c in COMMANDS}
    assert {"README.md", "deploy/README.md", "service/README.md", "workers/README.md",
            "docs/architecture.md", "docs/testing.md",
            "service/bench/api_load.py (help)"} <= sources
    assert "bash scripts/test.sh -m slow" in texts  # an indented code line (docs/testing.md)
    assert "python3 -m venv .venv" in texts and "bash scripts/run.sh --port 8001" in texts
    assert ("gdn-sweep bench api --concurrency 50,500 --duration-s 30 --workers 1,2 "
            "--uncached --baseline DIR") in texts  # an inline span over two lines
    assert "gdn-sweep bench cp-gdn" in texts  # the README's `bench NAME` row
    assert "gdn-sweep import results/*.jsonl --db \"$DATABASE_URL\"" in texts  # a fence
    assert any(t.startswith("ray submit deploy/cluster-gcp-h100.yaml deploy/run_sweep.py -- ")
               for t in texts)  # the crontab line's command
    assert "gdn-sweep regressions --schedule nightly" in texts  # `… || mail …` split


def test_the_notation_expands_to_each_documented_form():
    assert variants("gdn-sweep schedule show ID | pause ID [--db URL]") == [
        ["gdn-sweep", "schedule", "show", "1"], ["gdn-sweep", "schedule", "pause", "1"],
        ["gdn-sweep", "schedule", "pause", "1", "--db", "sqlite:///gdn_sweep.db"]]
    assert variants("x [--a N | --b FILE...] [--c cpu|cuda] [--modes ...]") == [
        ["x"], ["x", "--a", "2", "--c", "cpu"], ["x", "--b", "results.jsonl", "--c", "cuda"]]
    assert variants("x [--layers hybrid [--no-measure]]") == [
        ["x"], ["x", "--layers", "hybrid", "--no-measure"]]
    assert variants("gdn-sweep bench sweep [SWEEP.yaml] [options]") == [
        ["gdn-sweep", "bench", "sweep"], ["gdn-sweep", "bench", "sweep", "sweep.yaml"]]
    with pytest.raises(KeyError, match="PLACEHOLDERS"):
        variants("gdn-sweep plan --validate SOMETHING_NEW")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("words, expected", [
    (["gdn-sweep", "bench", "api", "--concurrency", "5", "--uncached"], None),
    (["gdn-sweep", "bench", "api", "--no-such-option"], "unrecognized arguments"),
    (["gdn-sweep", "bench", "memory", "--chips", "two"], "invalid int value"),
    (["gdn-sweep", "results", "--kind", "guess"], "invalid choice"),
    (["gdn-sweep", "serve", "--no-such-option"], "unrecognized arguments"),
    (["python", "-m", "gdn_core.bench", "step", "--remat", "sometimes"], "invalid choice"),
    (["python", "deploy/run_sweep.py", "s.yaml", "--new"], "unrecognized arguments"),
    (["ray", "submit", "deploy/cluster-cpu.yaml", "deploy/run_sweep.py", "--", "s.yaml",
      "--jsonl", "d/"], None),
    (["bash", "scripts/device-check.sh", "--plan"], None),
    (["bash", "scripts/device-check.sh", "--quick"], "accepts one of"),
    (["bash", "scripts/run.sh", "--smoke", "--port", "x"], "invalid int value"),
    (["python", "-m", "service.demo_gone"], "PARSED_MODULES"),
    (["gdn-sweep", "run", "deploy/sweeps/no-such.yaml"], "no such file"),
    (["helm", "install"], "FOREIGN_PROGRAMS"),
], ids=lambda value: " ".join(value) if isinstance(value, list) else None)
def test_the_check_refuses_what_would_not_run(words, expected):
    problem = problem_of(words)
    if expected is None:
        assert problem is None, problem
    else:
        assert problem is not None and expected in problem, problem
