"""The outputs the docs show, checked against fresh runs (sybil reads the Markdown).

A shown output is a fenced ``console`` block: ``$ t3emu ...`` lines (a trailing ``\\``
continues one), each followed by the lines it prints. ``tests/test_doc_examples.py``
runs each command as a user does (``python -m emulator.app.cli``, from the checkout) and
requires every shown line, in order, among the lines it printed (stdout and stderr
together), equal after masking this host's wall times and the spacing (a table's
columns widen with its wall times); a shown line ending in ``...`` is
abridged (the printed line starts with what precedes the ``...``), and the printed lines
not shown are left out of the docs on purpose. So every modelled figure a doc shows is
the code's.

A ``generated`` block is written the same way but holds outputs too slow for the suite
(minutes of runs: the emulated nccl-tests tables, a paper sweep's report); it is the whole
of what its commands print, made by them, and the update below rewrites it whole. Two
notes a command may end with (after ``  # ``): ``run first`` (a prerequisite, such as the
sweep a report reads: the reader runs it, the update does not, and its output is not
shown) and ``section: TITLE`` (only the part of the output from the line that starts with
TITLE to the next blank line is shown).

After a change that moves the numbers on purpose, rewrite the shown lines from fresh runs
(the abridged shape kept; ``generated`` blocks whole):

    python -m tests.doc_examples --update            # every doc
    python -m tests.doc_examples --update README.md  # one
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LANGUAGE = "console"
GENERATED = "generated"
PROMPT = "$ "
# this host's wall times: the summary's wall column, progress lines, sweep lines
WALL = [(re.compile(r"\b\d+\.\d+s$"), "<wall>"),
        (re.compile(r"\b\d+(\.\d+)? s wall\b"), "<wall> s wall"),
        (re.compile(r"\bdone in \d+ s\b"), "done in <wall> s"),
        (re.compile(r"\bin \d+ s\)"), "in <wall> s)")]


def files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def mask(line: str) -> str:
    """A line without this host's wall times and without its spacing (a table's columns
    are as wide as their widest cell, a wall time's among them), a table's rule as one
    ``--``."""
    line = line.rstrip()
    for pat, rep in WALL:
        line = pat.sub(rep, line)
    return " ".join(re.sub(r"^[ -]*-{2,}[ -]*$", "--", line).split())


def commands(text: str, raw: bool = False) -> list[tuple]:
    """(command, shown lines) of each ``$`` command of a block (``raw``: and the lines the
    command is written on)."""
    out: list[tuple] = []
    cont = False
    for line in text.splitlines():
        if cont:
            out[-1][0].append(line.strip().rstrip("\\").strip())
            out[-1][2].append(line)
            cont = line.rstrip().endswith("\\")
        elif line.startswith(PROMPT):
            out.append(([line[len(PROMPT):].rstrip().rstrip("\\").strip()], [], [line]))
            cont = line.rstrip().endswith("\\")
        elif out:
            out[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"a line before the block's first command: {line!r}")
    return [(" ".join(c), shown, *([lines] if raw else [])) for c, shown, lines in out]


def note(command: str) -> tuple[str, str]:
    """(the command, its note after ``  # `` or "")."""
    cmd, _, what = command.partition("  # ")
    return cmd.strip(), what.strip()


def section(lines: list[str], title: str) -> list[str]:
    """The lines from the one starting with ``title`` to the next blank one."""
    for i, line in enumerate(lines):
        if line.startswith(title):
            end = next((j for j in range(i, len(lines)) if not lines[j].strip()), len(lines))
            return lines[i:end]
    raise AssertionError(f"no section {title!r} in the output")


def run(command: str, timeout: float = 900) -> list[str]:
    """The lines ``command`` prints (stdout and stderr as they come)."""
    command, what = note(command)
    if what.startswith("section: "):
        return section(run(command, timeout), what[len("section: "):])
    argv = shlex.split(command)
    if argv[0] != "t3emu":
        raise ValueError(f"a shown command must start with t3emu: {command!r}")
    from tests.conftest import test_env

    # the tables fitted to a fixed width (the docs' 120 columns), whatever the terminal
    proc = subprocess.run([sys.executable, "-m", "emulator.app.cli", *argv[1:]], cwd=ROOT,
                          env={**test_env(), "COLUMNS": "120"}, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{command!r} exited {proc.returncode}:\n{proc.stdout}")
    return proc.stdout.splitlines()


def _abridged(line: str) -> str | None:
    s = line.rstrip()
    return s[:-3].rstrip() if s.endswith("...") else None


def _matches(shown: str, printed: str) -> bool:
    prefix = _abridged(shown)
    if prefix is not None:
        return mask(printed).startswith(mask(prefix))
    return mask(shown) == mask(printed)


def differences(shown: list[str], printed: list[str]) -> list[str]:
    """The shown lines not found, in order, among the printed ones."""
    missing, at = [], 0
    for line in shown:
        if not line.strip() or line.strip() == "...":
            continue
        for j in range(at, len(printed)):
            if _matches(line, printed[j]):
                at = j + 1
                break
        else:
            missing.append(line)
    return missing


def check(example) -> str | None:
    """sybil's evaluator: None when every shown line is printed, else what is not."""
    problems = []
    for command, shown in commands(example.parsed):
        if note(command)[1] == "run first":
            continue
        printed = run(command)
        missing = differences(shown, printed)
        if missing:
            problems.append(f"$ {command}\nshown but not printed:\n" + "\n".join(missing)
                            + "\nprinted:\n" + "\n".join(printed))
    return "\n\n".join(problems) or None


def _key(line: str) -> str:
    """A line without its numbers and its spacing (a table's rule: one ``--``): which
    printed line a shown one stands for."""
    line = re.sub(r"^[ -]*-{2,}[ -]*$", "--", line)
    return " ".join(re.sub(r"[-+]?\d[\d,]*(\.\d+)?", "#", line).split())


def updated(text: str, whole: bool = False) -> str:
    """A block's text with each shown line replaced by the printed line it stands for
    (``whole``: by everything its command prints)."""
    out = []
    for command, shown, lines in commands(text, raw=True):
        out += lines
        if note(command)[1] == "run first":
            continue
        printed = run(command)
        if whole:
            out += [line.rstrip() for line in printed]
            continue
        at = 0
        for line in shown:
            if not line.strip() or line.strip() == "...":
                out.append(line)
                continue
            prefix = _abridged(line)
            key = _key(prefix if prefix is not None else line)
            for j in range(at, len(printed)):
                cand = printed[j]
                if (_key(cand).startswith(key) if prefix is not None else _key(cand) == key):
                    at = j + 1
                    if prefix is not None:  # as many characters as were shown
                        cand = cand[:len(prefix)].rstrip() + " ..."
                    line = cand
                    break
            out.append(line.rstrip())
    return "\n".join(out) + "\n"


def sybil():
    from sybil import Sybil
    from sybil.parsers.markdown import CodeBlockParser

    return Sybil(parsers=[CodeBlockParser(language=LANGUAGE, evaluator=check)])


# the docs whose ``python`` blocks are doctests of the API (``>>>``: run as shown, in a
# directory of their own); other docs' Python blocks are listings, not run
DOCTESTS = ("docs/api.md",)


def python_sybil():
    import doctest

    from sybil import Sybil
    from sybil.parsers.markdown import PythonCodeBlockParser

    return Sybil(parsers=[PythonCodeBlockParser(
        doctest_optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)])


def examples() -> list:
    """Every shown command output of the docs (sybil's examples, one per block)."""
    s = sybil()
    return [ex for path in files() for ex in s.parse(path).examples()]


def doctests() -> dict[str, list]:
    """Each doctest doc's examples, in order (they share one namespace: run together)."""
    py = python_sybil()
    return {name: list(py.parse(ROOT / name).examples()) for name in DOCTESTS}


def update(paths: list[Path]) -> None:
    fence = re.compile(r"^```(" + LANGUAGE + "|" + GENERATED + r")\n(.*?)^```$", re.M | re.S)
    for path in paths:
        text = path.read_text()
        new = fence.sub(lambda m: "```" + m.group(1) + "\n"
                        + updated(m.group(2), whole=m.group(1) == GENERATED) + "```", text)
        if new != text:
            path.write_text(new)
            print(f"updated {path.relative_to(ROOT)}")


if __name__ == "__main__":
    args = sys.argv[1:]
    if not args or args[0] != "--update":
        sys.exit(__doc__)
    update([ROOT / a for a in args[1:]] or files())
