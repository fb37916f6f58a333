"""Tables the command line prints: one set of rows, four forms (``--format``).

- ``table``: for a terminal, fitted to its width (``tabulate``; the widest text columns
  wrap at word boundaries until the table fits: ``$COLUMNS`` or the terminal's width,
  100 when the output is not a terminal and ``$COLUMNS`` is unset);
- ``csv``, ``json`` (a list of objects, the columns as keys), ``markdown`` (GitHub's
  pipe tables): the same rows for a spreadsheet, a script or a page.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil

FORMATS = ("table", "csv", "json", "markdown")
MIN_WIDTH = 8  # a wrapped column keeps at least this many characters


def width() -> int:
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return shutil.get_terminal_size((100, 24)).columns


def terminal_width() -> int | None:
    """``$COLUMNS``, else the terminal's width; None when the output is no terminal (a
    file or a pipe keeps a wide table whole, for scripts and ``less -S``)."""
    env = os.environ.get("COLUMNS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    import sys

    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def fill(text: str) -> str:
    """A line of prose wrapped to the terminal (`terminal_width`; whole when there is none)."""
    import textwrap

    room = terminal_width()
    return textwrap.fill(text, room, break_on_hyphens=False) if room else text


def column_groups(col_widths: list[int], limit: int, gap: int = 2) -> list[list[int]]:
    """The columns of a table too wide for ``limit`` as groups that each fit, every group
    led by the first column (the row's name), the others in order; a column wider than
    the room left beside the first stands alone with it."""
    groups: list[list[int]] = []
    for i in range(1, len(col_widths)):
        if groups and sum(col_widths[j] + gap for j in groups[-1]) + col_widths[i] <= limit:
            groups[-1].append(i)
        else:
            groups.append([0, i])
    return groups or [[0]]


def _fit(rows: list, headers: list[str], limit: int, wrap: list[bool] | None = None,
         align: list[str] | None = None) -> list[int | None]:
    """Each column's wrap width (None: as wide as it is) so the table fits ``limit``: the
    widest text column (one with spaces in its cells or header; never the first, the
    row's name; ``wrap``: the columns that may wrap instead) is narrowed first, never
    below its longest word, so no word is cut. ``rows`` may hold tabulate's
    SEPARATING_LINE (a rule)."""
    from tabulate import SEPARATING_LINE, tabulate

    widths: list[int | None] = [None] * len(headers)
    cells = [r for r in rows if r is not SEPARATING_LINE]
    if not cells:
        return widths

    def table_width() -> int:
        text = tabulate(*_wrapped(rows, headers, widths), tablefmt="simple",
                        disable_numparse=True, colalign=align)
        return max((len(line) for line in text.splitlines()), default=0)

    natural = [max([len(x) for x in h.splitlines() or [""]] + [len(r[i]) for r in cells])
               for i, h in enumerate(headers)]
    floor = [max([MIN_WIDTH] + [len(w) for r in cells for w in r[i].split()]
                 + [len(w) for w in headers[i].split()]) for i in range(len(headers))]
    text = wrap or [i > 0 and (" " in headers[i] or any(" " in r[i] for r in cells))
                    for i in range(len(headers))]
    over = table_width() - limit
    while over > 0:
        current = [w if w is not None else natural[i] for i, w in enumerate(widths)]
        narrower = [i for i in range(len(headers)) if text[i] and current[i] > floor[i]]
        if not narrower:
            break  # as narrow as it goes without cutting words: the terminal wraps the rest
        i = max(narrower, key=lambda j: current[j])
        widths[i] = max(floor[i], current[i] - max(2, over))
        over = table_width() - limit
    return widths


def _wrapped(rows: list, headers: list[str], widths: list[int | None]) -> tuple[list, list]:
    """The rows and headers with each cell of a column of a set width wrapped to it (at
    word boundaries, as tabulate's maxcolwidths does; here, so a cell such as "1,090" is
    never parsed as a number on the way)."""
    import textwrap

    from tabulate import SEPARATING_LINE

    def cell(text: str, w: int | None) -> str:
        if w is None:
            return text
        return "\n".join("\n".join(textwrap.wrap(line, w, break_on_hyphens=False)) for line in text.splitlines()
                         if line.strip())

    return ([r if r is SEPARATING_LINE else [cell(c, w) for c, w in zip(r, widths)]
             for r in rows], [cell(h, w) for h, w in zip(headers, widths)])


def render(rows: list[dict | None], columns: list[str], fmt: str = "table",
           limit: int | None = None, labels: dict[str, str] | None = None,
           align: dict[str, str] | None = None, wrap: list[str] | None = None,
           split: bool = False) -> str:
    """``rows`` (dicts, ``columns`` their keys in order; None: a rule across the table
    form, nothing in the others) in form ``fmt``; ``labels``: the headers of the table
    and Markdown forms (CSV and JSON keep the keys); ``align``: "right" (or "center") for
    the columns not aligned left; ``wrap``: the columns the table form may wrap to fit
    (default: the text columns, those with spaces, but the first); ``split``: a table
    form still wider than the terminal (`terminal_width`; ``limit`` if given) is printed
    as several tables of `column_groups`, one under the other, each led by the first
    column."""
    from tabulate import SEPARATING_LINE

    rules = [r is None for r in rows]
    rows = [r for r in rows if r is not None]
    if fmt == "json":
        return json.dumps([{c: r.get(c) for c in columns} for r in rows], indent=1)
    cells = [["" if r.get(c) is None else str(r.get(c)) for c in columns] for r in rows]
    colalign = [(align or {}).get(c, "left") for c in columns]
    if fmt == "csv":
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(columns)
        w.writerows(cells)
        return buf.getvalue().rstrip("\n")
    from tabulate import tabulate

    heads = [(labels or {}).get(c, c) for c in columns]
    if fmt == "markdown":
        return tabulate(cells, heads, tablefmt="github", disable_numparse=True,
                        colalign=colalign)
    if fmt != "table":
        raise ValueError(f"unknown format {fmt!r}; allowed: {', '.join(FORMATS)}")
    import tabulate as tb

    padding, tb.MIN_PADDING = tb.MIN_PADDING, 0  # (headers padded as the cells are)
    body, it = [], iter(cells)
    for rule in rules:
        body.append(SEPARATING_LINE if rule else next(it))
    try:
        widths = _fit(body, heads, limit or width(),
                      None if wrap is None else [c in wrap for c in columns], colalign)
        rows_w, heads_w = _wrapped(body, heads, widths)
        text = tabulate(rows_w, heads_w, tablefmt="simple", disable_numparse=True,
                        colalign=colalign)
        room = limit or terminal_width() if split else None
        if room is None or max(len(line) for line in text.splitlines()) <= room:
            return text
        col_widths = [max(len(x) for x in [*h.splitlines(), *(
            line for r in rows_w if r is not SEPARATING_LINE for line in r[i].splitlines())]
                          or [""]) for i, h in enumerate(heads_w)]
        return "\n".join(tabulate(  # (no blank line: a blank line ends a report's section)
            [r if r is SEPARATING_LINE else [r[i] for i in group] for r in rows_w],
            [heads_w[i] for i in group], tablefmt="simple", disable_numparse=True,
            colalign=[colalign[i] for i in group])
            for group in column_groups(col_widths, room))
    finally:
        tb.MIN_PADDING = padding
