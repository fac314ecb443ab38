"""Tables as plain text, Markdown or CSV, for `report` and `compare`.

Cells arrive already formatted as strings. `align` has one letter per column,
"l" or "r": numbers are right-aligned so that their digits line up.
"""

from __future__ import annotations

import csv
import io
import textwrap
from typing import Any, Callable, Dict, List, Sequence


def render(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str, fmt: str) -> str:
    if fmt == "markdown":
        return markdown(headers, rows, align)
    if fmt == "csv":
        return csv_text(headers, rows)
    return text(headers, rows, align)


def text(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if a == "r" else c.ljust(w)
                         for c, w, a in zip(cells, widths, align)).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths])]
                     + [line(r) for r in rows]) + "\n"


def markdown(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str) -> str:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    return "\n".join([line(headers), rule] + [line(r) for r in rows]) + "\n"


def csv_text(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(headers)
    writer.writerows([["" if c is None else c for c in row] for row in rows])
    return out.getvalue()


def by_group(pairs: Sequence[Dict[str, Any]], row: Callable[[Dict[str, Any]], List[str]],
             headers: Sequence[str], align: str, fmt: str) -> List[str]:
    """One table per group of compared pairs (each pair's "group"), in the order the
    groups first appear, each under its group's title."""
    h = "## " if fmt == "markdown" else ""
    out: List[str] = []
    for group in dict.fromkeys(p["group"] for p in pairs):
        rows = [row(p) for p in pairs if p["group"] == group]
        out += [f"{h}{group}", ""] if fmt == "markdown" else [group]
        out += [render(headers, rows, align, fmt)]
    return out


def row_fields(*own: str) -> tuple:
    """The raw fields of a table's row for --format csv and json: the configuration's
    first, then the table's own, then the flags that set the row apart."""
    return ("strategy", "topology", "workers", "runs", *own, "flags")


def heading(title: str, fmt: str) -> str:
    """A table's title: a Markdown heading, or underlined text."""
    return f"## {title}" if fmt == "markdown" else f"{title}\n{'=' * len(title)}"


def lines(found: Sequence[str], fmt: str) -> str:
    """Lines that name files, never wrapped (a path is not cut): a Markdown list, or
    one line each."""
    return "".join(f"- {line}\n" if fmt == "markdown" else f"{line}\n" for line in found)


def notes(lines: Sequence[str], fmt: str) -> str:
    """The notes under the tables: a Markdown list, or text wrapped at 88 columns."""
    if fmt == "markdown":
        return "".join(f"- {line}\n" for line in lines)
    return "".join(textwrap.fill(line, 88, subsequent_indent="  ") + "\n" for line in lines)
