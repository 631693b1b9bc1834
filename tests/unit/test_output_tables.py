"""The CLI's tables: a cell of several lines, and an error message wrapped whole (its hint kept)."""

from __future__ import annotations

from radixjobs import output
from radixjobs.retry import Category, Cause, redact


def test_a_cell_of_several_lines_keeps_the_columns_aligned() -> None:
    table = output.render_table(("status", "message"), [("failed", "one\ntwo"), ("ok", "")])
    assert table.splitlines() == ["status | message", "-------+--------", "failed | one", "       | two", "ok     |",
                                  "(2 rows)"]


def test_a_redacted_security_error_keeps_its_hint_in_the_history_table() -> None:
    for kind in ("no_password", "authentication_failed", "invalid_password"):
        message = redact(Cause(kind, Category.SECURITY, retryable=False), "server text")
        cell = output.wrapped(message)
        assert "…" not in cell
        assert " ".join(cell.split("\n")) == message  # every word, in order
        assert max(len(line) for line in cell.split("\n")) <= 60
        table = output.render_table(("status", "message"), [("failed", cell)])
        assert " ".join(line.split(" | ", 1)[1] for line in table.splitlines()[2:-1]) == message
        assert message.endswith("`radixjobs check` on the scheduler's node says what to fix (docs/external.md)")


def test_a_long_message_is_cut_to_five_lines_of_its_first_line() -> None:
    cell = output.wrapped("word " * 200 + "\nCONTEXT: second line")
    assert len(cell.split("\n")) == 5
    assert cell.endswith("…")
    assert "CONTEXT" not in cell
    assert output.wrapped(None) == ""
