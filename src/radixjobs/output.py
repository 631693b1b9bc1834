"""Human tables and JSON for the CLI."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import uuid
from collections.abc import Sequence
from typing import Any


def jsonable(value: Any) -> Any:
    """A JSON-friendly form of a PostgreSQL value (exact: decimals become strings)."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, decimal.Decimal):
        return int(value) if value == value.to_integral_value() and abs(value) < 2**63 else str(value)
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, bytes | bytearray | memoryview):
        return "\\x" + bytes(value).hex()
    return str(value)


def to_json(value: Any) -> str:
    return json.dumps(jsonable(value), indent=2, ensure_ascii=False)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, dict | list):
        return json.dumps(jsonable(value), ensure_ascii=False)
    return str(jsonable(value))


def render_table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, footer: bool = True) -> str:
    """An aligned table like psql's: header, rule, rows, and "(N rows)". A cell with several lines takes as
    many lines of the table, its neighbours blank below their first."""
    cells = [[_cell(v).split("\n") for v in row] for row in rows]
    widths = [max([len(c), *(len(line) for r in cells for line in r[i])]) for i, c in enumerate(columns)]
    lines = [" | ".join(c.center(w) for c, w in zip(columns, widths, strict=True)).rstrip(),
             "-+-".join("-" * w for w in widths)]
    for row in cells:
        for index in range(max((len(cell) for cell in row), default=1)):
            parts = (cell[index] if index < len(cell) else "" for cell in row)
            lines.append(" | ".join(v.ljust(w) for v, w in zip(parts, widths, strict=True)).rstrip())
    if footer:
        lines.append(f"({len(rows)} row{'' if len(rows) == 1 else 's'})")
    return "\n".join(lines)


def wrapped(text: Any, width: int = 60, max_lines: int = 5) -> str:
    """The first line of a text wrapped at ``width`` for a table cell, in at most ``max_lines`` lines (… when
    cut): long enough for a redacted error and what to do about it."""
    import textwrap

    first = "" if text is None else str(text).strip().split("\n", 1)[0]
    lines = textwrap.wrap(first, width)
    if len(lines) > max_lines:
        lines = [*lines[:max_lines - 1], one_line(lines[max_lines - 1] + " …", width)]
    return "\n".join(lines)


def render_records(records: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A table of dict rows (columns: the given ones, or the first record's keys)."""
    if columns is None:
        columns = list(records[0].keys()) if records else []
    return render_table(columns, [[r.get(c) for c in columns] for r in records])


def render_mapping(values: dict[str, Any]) -> str:
    """Key/value lines for one object."""
    width = max((len(k) for k in values), default=0)
    return "\n".join(f"{k.ljust(width)} : {_cell(v)}" for k, v in values.items())


def one_line(text: Any, width: int = 60) -> str:
    """The first line of a text, cut to ``width`` characters with … when longer."""
    line = "" if text is None else str(text).strip().split("\n", 1)[0].rstrip()
    return line if len(line) <= width else line[:width - 1] + "…"
