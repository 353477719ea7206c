"""The commands the project's documents show, as tests/test_documented_commands.py checks them.

Where a command is written (`collect`):
  - every *.md of the checkout (hidden folders, build outputs and virtual environments left
    out), and the help texts of the commands that print one (HELP_MODULES: their docstring is
    their --help);
  - a line of a fenced code block (none, bash, sh, shell or console; yaml, python, sql are
    not commands), with `\\` continuations joined and `#` comments dropped;
  - an indented code line (4+ spaces, after a blank line or another such line; in a help text
    also the more deeply indented `[...]` lines that continue it, and the command ends where
    three spaces or more begin its description);
  - an inline code span that starts with a program of PROGRAMS and has arguments (a program
    named alone is a mention), or with `bench NAME` (the README's benchmarks row abbreviates
    `gdn-sweep bench NAME` so); `ray …` spans only where they run deploy/run_sweep.py (the
    others name Ray's own commands).
A line is split into shell commands at `&&`, `||` and `;`, and leading VAR=value assignments,
redirections and a crontab line's schedule fields are dropped. Code-block lines whose program
is not one of PROGRAMS must be one of FOREIGN_PROGRAMS (a program of another project, with why
it is not checked here).

The documents' notation (`variants`): `[...]` is optional, `A | B` inside it and `a|b` inside a
word are alternatives, `X ID | pause ID` on a line alternates X's trailing words, `…` / `...`
repeat what precedes them (after an option they elide its values: the option is left out),
and `[options]` / `[filters]` stand for the command's options (left out). A command is
checked with every optional part left out, and with all of them in once per alternative. A
word in capitals (NAME, ID, URL, FILE, DIR/, N, …) is a placeholder and takes PLACEHOLDERS'
value (an unknown one fails: choose its value there); `$VAR`, `$(...)`, `~/...` and globs
stay as the literal words, as a parser sees any string.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIPPED_DIRS = {"build", "node_modules", "shared", "__pycache__"}
HELP_MODULES = ("gdn_core/bench/kernel.py", "gdn_core/bench/cp.py",
                "gdn_core/bench/cp_gdn_kernels.py", "gdn_core/bench/memory.py",
                "gdn_core/bench/step.py", "workers/bench_scheduling.py",
                "service/bench/sweep.py", "service/bench/api_load.py", "service/demo.py",
                "service/cli/main.py", "scripts/device-check.sh")
"""Files whose leading docstring (or comment block) is what the command's --help prints."""
PROGRAMS = ("gdn-sweep", "python", "python3", "bash", "ray", "pytest")
"""Programs whose commands are checked (ray: `ray submit` / `ray job submit` of this
project's script; ray's other commands are foreign)."""
FOREIGN_PROGRAMS = {
    "export": "a shell builtin: sets what the commands after it read",
    "cd": "a shell builtin",
    "source": "a shell builtin: activates the virtual environment the set-up makes",
    "docker": "Docker's CLI (its -f deploy/Dockerfile is checked to exist)",
    "kubectl": "Kubernetes' CLI, against a cluster (its -f file is checked to exist)",
    "gcloud": "Google Cloud's CLI, against a cloud project",
    "pip": "pip installs; the packages are pyproject's",
    "mail": "the cron example's mailer",
    "git": "git itself",
    "tar": "tar itself",
}
FOREIGN_MODULES = {
    "venv": "the standard library's virtual environments (the README's set-up)",
}
"""`python -m MODULE` commands of other projects: not parsed here, and why."""
FOREIGN_RAY_COMMANDS = ("up", "exec", "rsync-down", "get-auth-token", "dashboard", "monitor")
"""Ray's cluster launcher: needs a cloud or SSH hosts (tests/deploy/ runs some on a local
head); the config files they name are checked to exist."""
PLACEHOLDERS = {"URL": "sqlite:///gdn_sweep.db", "ID": "1", "SWEEP_ID": "1", "N": "2",
                "NAME": "nightly", "FILE": "results.jsonl", "DIR": "dir", "DIR/": "dir/",
                "A": "127.0.0.1:6379", "L": "info", "SWEEP.yaml": "sweep.yaml",
                "F": "results.jsonl"}
CHECKOUT_FOLDERS = ("deploy/", "scripts/", "tests/", "service/", "workers/", "gdn_core/")
"""A word starting with one of these names a file of the checkout, which must exist."""


@dataclasses.dataclass(frozen=True)
class Command:
    source: str
    """path:line of the document."""
    text: str
    inline: bool
    """From an inline code span: may be a mention (a program named without its arguments)."""

    @property
    def id(self) -> str:
        return f"{self.source}:{self.text[:70]}"


def documents() -> list[Path]:
    found = []
    for path in sorted(ROOT.rglob("*.md")):
        parts = path.relative_to(ROOT).parts[:-1]
        if any(p.startswith(".") or p in SKIPPED_DIRS or p.endswith(".egg-info")
               for p in parts):
            continue
        found.append(path)
    return found


def collect() -> list[Command]:
    commands = []
    for path in documents():
        commands += _from_markdown(path.read_text(), str(path.relative_to(ROOT)))
    for name in HELP_MODULES:
        commands += _from_help(_leading_doc((ROOT / name).read_text()), f"{name} (help)")
    return commands


def _leading_doc(source: str) -> str:
    """A module's docstring, or a script's leading comment block (its `#` removed)."""
    match = re.match(r'\s*"""(.*?)"""', source, re.S)
    if match:
        return match.group(1)
    lines = [line[2:] if line.startswith("# ") else line[1:] for line in source.splitlines()[1:]
             if line.startswith("#")]
    return "\n".join(lines)


def _from_markdown(text: str, name: str) -> list[Command]:
    found, lines = [], text.splitlines()
    fence, block, prose = None, [], []
    previous_blank, in_indented = True, False
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            if fence is None:
                fence = stripped[3:].strip() or "none"
                block = []
            else:
                if fence in ("none", "bash", "sh", "shell", "console"):
                    found += _code_lines(block, name)
                fence = None
            continue
        if fence is not None:
            block.append((number, line))
            continue
        indented = line.startswith("    ") and stripped
        if indented and (previous_blank or in_indented) and stripped.split()[0] in PROGRAMS:
            found += _code_lines([(number, line)], name)
            in_indented = True
        else:
            in_indented = False
            prose.append((number, line))
        previous_blank = not stripped
    found += _inline_spans(prose, name)
    return found


def _from_help(text: str, name: str) -> list[Command]:
    """Indented command lines of a help text, with their deeper `[...]` continuation lines."""
    found, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        indent = len(line) - len(line.lstrip())
        words = line.split()
        if indent >= 2 and words and words[0] in PROGRAMS:
            number, parts = i + 1, [line]
            while i + 1 < len(lines) and lines[i + 1].strip().startswith(("[", "-")) and \
                    len(lines[i + 1]) - len(lines[i + 1].lstrip()) > indent:
                i += 1
                parts.append(lines[i])
            command = " ".join(p.strip().rstrip("\\").strip() for p in parts)
            # the description column, three spaces or more after the command, is no part of it
            found += _code_lines([(number, re.split(r"\s{3,}", command)[0])], name)
        i += 1
    return found


def _code_lines(block: list[tuple[int, str]], name: str) -> list[Command]:
    found, joined, start = [], "", None
    for number, line in block:
        start = start or number
        if line.rstrip().endswith("\\"):
            joined += line.rstrip()[:-1] + " "
            continue
        joined += line
        # a crontab line: its five schedule fields, then the command
        joined = re.sub(r"^\s*(?:[\d*/,-]+\s+){5}(?=\D)", "", joined)
        for text in _shell_commands(_drop_comment(joined)):
            found.append(Command(f"{name}:{start}", text, inline=False))
        joined, start = "", None
    return found


def _drop_comment(line: str) -> str:
    """The line without its `# comment` (a `#` outside quotes, after a space)."""
    quote = None
    for i, char in enumerate(line):
        if char in "'\"" and quote in (None, char):
            quote = None if quote else char
        elif char == "#" and quote is None and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def _inline_spans(prose: list[tuple[int, str]], name: str) -> list[Command]:
    """Code spans of the prose that start with a program (they may wrap a line)."""
    found = []
    text = "\n".join(line for _, line in prose)
    numbers = [number for number, _ in prose]
    for match in re.finditer(r"`([^`]+)`", text):
        span = " ".join(match.group(1).split())
        if span.startswith("bench "):
            span = "gdn-sweep " + span
        line = numbers[text.count("\n", 0, match.start())]
        for part in _shell_commands(span):
            words = part.split()
            if len(words) > 1 and words[0] in PROGRAMS and (
                    words[0] != "ray" or "deploy/run_sweep.py" in words):
                found.append(Command(f"{name}:{line}", part, inline=True))
    return found


def _shell_commands(line: str) -> list[str]:
    """The commands of a shell line: split at &&, || and ;, with $(...), redirections and
    leading VAR=value assignments left out."""
    line = re.sub(r"\$\([^)]*\)", "$SUBSTITUTED", line)
    line = re.sub(r"\s\d*>>?&?\s*\S+", " ", line)
    parts = (re.sub(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*", "", part.strip())
             for part in re.split(r"\s(?:&&|\|\||;)\s", line))
    return [part for part in parts if part]


def words_of(text: str) -> list[str]:
    """The shell words of a command, `[` and `]` as words of their own."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars="[]")
    lexer.whitespace_split = True
    lexer.commenters = ""
    # shlex makes one word of a run of punctuation (`]]`): each bracket is a word
    return [w for word in lexer for w in (list(word) if set(word) <= set("[]") else [word])]


def variants(text: str) -> list[list[str]]:
    """Concrete argument lists of a documented command (see the module docstring)."""
    return _variants(words_of(text))


def _variants(words: list[str]) -> list[list[str]]:
    if "|" in words and "[" not in words[:words.index("|")]:
        # `gdn-sweep schedule show ID | pause ID | …`: alternatives to the first's last words
        first, *others = _split(words, "|")
        return [v for alt in [first] + [first[:len(first) - len(_plain(o))] + o for o in others]
                for v in _variants(alt)]
    tree = _parse(words)
    out = [_expand(tree, None)] + [_expand(tree, k) for k in range(_width(tree))]
    return [v for i, v in enumerate(out) if v not in out[:i]]


def _split(words: list[str], sep: str) -> list[list[str]]:
    parts, current = [], []
    for word in words:
        if word == sep:
            parts.append(current)
            current = []
        else:
            current.append(word)
    return parts + [current]


def _plain(words: list[str]) -> list[str]:
    return words[:words.index("[")] if "[" in words else words


def _parse(words: list[str]) -> list:
    """Words and optional groups (a list of alternatives, each parsed likewise)."""
    items, i = [], 0
    while i < len(words):
        if words[i] == "[":
            depth, j = 1, i + 1
            while depth:
                depth += {"[": 1, "]": -1}.get(words[j], 0)
                j += 1
            if words[i + 1:j - 1] not in (["options"], ["filters"]):  # "its options": none
                items.append([_parse(alt) for alt in _split(words[i + 1:j - 1], "|")])
            i = j
        else:
            items.append(words[i])
            i += 1
    return items


def _width(items: list) -> int:
    """How many variants tell every alternative apart."""
    return max([1] + [max([len(item)] + [_width(alt) for alt in item]) if isinstance(item, list)
                      else len(_alternatives(item)) for item in items])


def _alternatives(word: str) -> list[str]:
    return word.split("|") if "|" in word.strip("|") else [word]


def _expand(items: list, k: int | None) -> list[str]:
    """Optional groups left out (k None) or in, with alternative k (or the last) of each."""
    out = []
    for item in items:
        if isinstance(item, list):
            if k is not None:
                out += _expand(item[min(k, len(item) - 1)], k)
        elif item in ("…", "..."):
            if out and out[-1].startswith("-"):
                out.pop()  # `--modes ...`: the option's values elided, so the option left out
        else:
            alts = _alternatives(item)
            out.append(_placeholder(alts[min(k or 0, len(alts) - 1)]))
    return out


def _placeholder(word: str) -> str:
    word = word.removesuffix("...").removesuffix("…")
    if word in PLACEHOLDERS:
        return PLACEHOLDERS[word]
    if re.fullmatch(r"[A-Z][A-Z0-9_]*/?", word):
        raise KeyError(f"placeholder {word!r}: give it a value in PLACEHOLDERS "
                       f"(tests/documented_commands.py)")
    return word


def checkout_paths(words: list[str]) -> list[str]:
    """The words that name a file of the checkout (globs and placeholders aside)."""
    return [w for w in words if w.startswith(CHECKOUT_FOLDERS) and not set(w) & set("*?$<>")]
