"""Tables that never cut a name: the columns a user types from (a model's
name, a setting, a tool) are shown whole at any width; the others wrap,
and where the table is still too wide for the terminal, drop in a stated
order (for `list`: source, then context, then arch)."""

from __future__ import annotations

import io
from typing import Any, Sequence

from rich.cells import cell_len
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text


def _width(cell: str) -> int:
    return max((Text.from_markup(line).cell_len for line in cell.splitlines() or [""]),
               default=0)


def fitted(headers: Sequence[str], rows: Sequence[Sequence[str]], console: Console, *,
           whole: Sequence[str], drops: Sequence[str] = (), **table_kwargs: Any) -> Table:
    """A table of `rows` (cells in `headers`' order) for `console`'s width:
    the `whole` columns never wrap nor cut; the `drops` columns are left
    out, in that order, while the table is wider than the console; the
    others wrap."""
    shown = list(headers)
    while True:
        table = _table(headers, shown, rows, whole, table_kwargs)
        natural = Measurement.get(console, console.options.update(width=1 << 16), table).maximum
        # A wrapping column can give up all but WRAPPED columns of its width.
        spare = sum(max(0, _natural(headers, rows, i) - WRAPPED) for i, h in enumerate(headers)
                    if h in shown and h not in whole)
        left = [h for h in drops if h in shown]
        if natural - spare <= console.width or not left:
            if _wider(table, console.width):
                table = _table(headers, shown, rows, whole, table_kwargs, words=False)
            return table
        shown.remove(left[0])


def _wider(table: Table, width: int) -> bool:
    """Whether `table` drawn `width` columns wide would run past them."""
    probe = Console(width=width, file=io.StringIO(), color_system=None, legacy_windows=False)
    with probe.capture() as drawn:
        probe.print(table, crop=False)
    return any(cell_len(line) > width for line in drawn.get().splitlines())


WRAPPED = 12        # the narrowest a wrapping column is let become
WORD = 16           # the longest word a wrapping column keeps on one line


def _natural(headers: Sequence[str], rows: Sequence[Sequence[str]], i: int) -> int:
    return max([_width(headers[i])] + [_width(r[i]) for r in rows])


def _table(headers: Sequence[str], shown: list[str], rows: Sequence[Sequence[str]],
           whole: Sequence[str], kwargs: dict, words: bool = True) -> Table:
    table = Table(**kwargs)
    keep = [i for i, h in enumerate(headers) if h in shown]
    for i in keep:
        header = headers[i]
        if header in whole:
            table.add_column(header, no_wrap=True, min_width=_natural(headers, rows, i))
        else:   # wrapped between words; a word is cut only past WORD characters
            longest = [len(w) for r in rows for w in Text.from_markup(r[i]).plain.split()]
            table.add_column(header, overflow="fold",
                             min_width=min(max(longest, default=1), WORD) if words else None)
    for row in rows:
        table.add_row(*(row[i] for i in keep))
    return table


def pairs(rows: Sequence[tuple[str, str]]) -> Table:
    """A two-column key/value listing (`show`, `info`): keys whole, each
    value wrapped, never cut."""
    width = max((_width(k) for k, _ in rows), default=0)
    table = Table(show_header=False, box=None)
    table.add_column(no_wrap=True, min_width=width)
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value)
    return table
