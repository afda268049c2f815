"""Fitting the CLI's rich tables to the terminal: readable at 80 columns.

rich never prints a line wider than the console, but it gets there by squeezing every
column: at 80 columns a table of run ids and figures became a grid of `20…` and `co…`.
Here a table is fitted before it is printed, in the order that keeps what matters:
first columns of long text (a decision, a note) move below the table as one line per
row, then the columns a caller names as least useful are dropped (each only while the
table is still too wide), then the outer border goes, then (for tables whose columns
are runs) the column headers become letters with a legend below. What is left wraps
inside its cells, whole words, never cut.
"""

from __future__ import annotations

from collections.abc import Sequence
from string import ascii_uppercase

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

UNBOUNDED = 100_000
LABEL_MIN = 16  # the narrowest a lettered table's label column is made before lettering


def natural_width(table: Table, console: Console) -> int:
    """The width the table takes with no cell wrapped (measured on an unbounded line:
    a measurement is capped at the space it is given)."""
    return Measurement.get(console, console.options.update_width(UNBOUNDED), table).maximum


def _header(column: object) -> str:
    return str(getattr(column, "header", ""))


def fit(table: Table, console: Console, drop: Sequence[str] = (),
        spill: Sequence[str] = (), letters: bool = False) -> list[str]:
    """Narrow `table` to the console's width in place; returns the lines to print after
    it (spilled cells, or with `letters` which run each lettered column is).

    `spill`: headers of text columns that may move below the table, each row's cell as
    `<its first cell>: <text>`. `drop`: headers of columns that may go, least useful
    first; a header not in the table is skipped. `letters`: every column but the
    first may be renamed A, B, ...
    """
    width = console.width
    lines: list[str] = []
    keys = [str(cell) for cell in table.columns[0].cells] if table.columns else []
    for header in spill:
        found = [c for c in table.columns[1:] if _header(c) == header]
        if not found or natural_width(table, console) <= width:
            continue
        table.columns.remove(found[0])
        lines += [f"{key}: {cell}" for key, cell in zip(keys, found[0].cells, strict=False)
                  if str(cell).strip()]
    for header in drop:
        if natural_width(table, console) <= width:
            return lines
        table.columns[:] = [c for c in table.columns if _header(c) != header]
    if natural_width(table, console) <= width:
        return lines
    table.show_edge = False
    if not letters or natural_width(table, console) <= width:
        return lines
    table.columns[0].max_width = max(LABEL_MIN, width // 3)  # the labels may wrap first
    if natural_width(table, console) <= width:
        return lines
    for letter, column in zip(ascii_uppercase, table.columns[1:], strict=False):
        lines.append(f"{letter}: {_header(column)}")
        column.header = letter
    return lines


def print_fitted(console: Console, table: Table, drop: Sequence[str] = (),
                 spill: Sequence[str] = (), letters: bool = False) -> None:
    """Fit `table` to the console (see `fit`) and print it, then the lines `fit` gave."""
    lines = fit(table, console, drop, spill, letters)
    console.print(table)
    for line in lines:
        console.print(line, highlight=False)
