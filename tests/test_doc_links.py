"""Every document link and file reference names something in the repository (issue 35: the
READMEs and docstrings sent readers to an `ARCHITECTURE.md` 33 times, and no such file was
in the repository).

Checked, over the checkout's documents and source (hidden folders, virtual environments and
build outputs left out):
  - markdown links `[text](target)` in every *.md: the target file exists (relative to the
    document), and an anchor into a markdown file (`file.md#section`, or `#section` within
    the document) names one of its headings, as GitHub spells them;
  - every `NAME.md`-style reference in code, comments, scripts and documents (a word ending
    `.md`, URLs aside): a file of that path exists, from the repository's root or from the
    referring file's folder.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.documented_commands import ROOT, SKIPPED_DIRS, documents

SOURCE_SUFFIXES = (".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".js", ".html", ".css",
                   ".ini", ".cfg", ".crontab", ".txt")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^()\s]+)\)")
MD_REFERENCE = re.compile(r"(?<![\w./-])((?:\.\./|\./)*[\w][\w./-]*\.md)(?![\w-])")
URL = re.compile(r"\b(?:https?|file)://\S+")
WRITTEN_FILES = {
    "step-table.md": "what `python -m gdn_core.bench step --out DIR` writes (step_table.py)",
}
"""`.md` names of files the code writes, not files of the repository (and why)."""


def source_files() -> list[Path]:
    found = []
    for path in sorted(ROOT.rglob("*")):
        parts = path.relative_to(ROOT).parts
        if not path.is_file() or path.suffix not in SOURCE_SUFFIXES and path.name != "run":
            continue
        if any(p.startswith(".") and p != ".ci" or p in SKIPPED_DIRS or p.endswith(".egg-info")
               for p in parts[:-1]):
            continue
        found.append(path)
    return found


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a markdown heading: lower case, punctuation dropped (hyphens
    and underscores kept), spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file: its headings', and explicit `<a id="…">` ones."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # no headings in code
    return ({github_anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", text,
                                                           re.M)}
            | set(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text)))


def link_problems(document: Path, root: Path = ROOT) -> list[str]:
    problems = []
    text = re.sub(r"```.*?```", "", document.read_text(), flags=re.S)
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (document.parent / file_part).resolve() if file_part else document
        if not linked.exists() or root not in linked.parents and linked != root:
            problems.append(f"{target}: no such file in the repository")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            problems.append(f"{target}: {linked.relative_to(root)} has no heading #{anchor}")
    return problems


def reference_problems(path: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        for match in MD_REFERENCE.finditer(URL.sub("", line)):
            name = match.group(1)
            if name in WRITTEN_FILES:
                continue
            if not any((base / name).resolve().is_file() for base in (root, path.parent)):
                problems.append(f"line {number}: {name}: no such file in the repository")
    return problems


DOCUMENTS = [p for p in documents()]
SOURCES = source_files()


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_links_resolve(document):
    problems = link_problems(document)
    assert not problems, f"{document.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_no_file_refers_to_a_markdown_file_that_is_not_there():
    problems = [f"{path.relative_to(ROOT)}: {problem}" for path in SOURCES
                if path != Path(__file__).resolve()  # its own examples of broken references
                for problem in reference_problems(path)]
    assert not problems, "\n".join(problems)


def test_the_checks_see_what_they_check(tmp_path):
    """The scan covers the code and the documents, and would catch the issue-35 reference
    and a broken link or anchor."""
    names = {str(p.relative_to(ROOT)) for p in SOURCES}
    assert {"README.md", "docs/architecture.md", "docs/testing.md", "gdn_core/datasheets.py",
            "workers/result.py", "service/cli/main.py", ".ci/run"} <= names
    assert github_anchor("Interpreted kernels: a correctness run, not a speed") == \
        "interpreted-kernels-a-correctness-run-not-a-speed"
    assert github_anchor("The library: `gdn_core`") == "the-library-gdn_core"
    assert "metrics" in anchors(ROOT / "docs/architecture.md")
    assert "profiles" in anchors(ROOT / "service/README.md")  # an explicit <a id=…>

    # a repository of two files: the architecture page, and a module and a page referring
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "architecture.md").write_text("# Architecture\n\n## Metrics\n")
    stale = tmp_path / "module.py"
    stale.write_text('"""See ARCHITECTURE.md, Metrics; docs/architecture.md is fine."""\n')
    page = tmp_path / "docs" / "page.md"
    page.write_text("[a](architecture.md#metrics) [b](architecture.md#no-such) [c](gone.md) "
                    "[d](https://example.com/x.md) [e](#architecture)\n")
    assert reference_problems(stale, tmp_path) == [
        "line 1: ARCHITECTURE.md: no such file in the repository"]
    assert link_problems(page, tmp_path) == [
        "architecture.md#no-such: docs/architecture.md has no heading #no-such",
        "gone.md: no such file in the repository",
        "#architecture: docs/page.md has no heading #architecture"]
