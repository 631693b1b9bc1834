"""The job DDL parser and the script splitter under the campaign's profile.

The parser's strategies live in tests/unit/test_ddl_fuzz.py (fixed, small example counts there); here
they run with the profile's count, plus what that file does not cover: the script splitter that
``radixjobs sql`` puts in front of the parser, and whole scripts mixing job DDL with ordinary SQL.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from radixjobs.ddl import is_job_statement, parse_job_statement
from radixjobs.errors import ParseError
from radixjobs.model import CreateJob
from radixjobs.sqlscript import split_script
from tests.fuzz import fuzz_settings
from tests.unit.test_ddl_fuzz import (
    SQL_ALPHABET,
    TOKENS,
    VALID,
    create_statements,
    mutated_statements,
    parses_or_fails_cleanly,
)

PLAIN_SQL = ["SELECT 1", "CREATE TABLE t (a int)", "INSERT INTO t VALUES (';')", "SELECT $$;$$",
             "CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; END",
             "COMMENT ON TABLE t IS 'a;b'", 'SELECT "a;b" FROM t', "/* ; */ SELECT 2"]


@fuzz_settings()
@given(st.text(max_size=400))
def test_random_text_raises_only_parse_error(text: str) -> None:
    parses_or_fails_cleanly(text)


@fuzz_settings()
@given(st.lists(st.sampled_from(TOKENS), max_size=60), st.sampled_from([" ", "", "\n", "\t"]))
def test_token_soup_raises_only_parse_error(tokens: list[str], separator: str) -> None:
    parses_or_fails_cleanly(separator.join(tokens))


@fuzz_settings()
@given(mutated_statements())
def test_mutated_statements_raise_only_parse_error(text: str) -> None:
    parses_or_fails_cleanly(text)


@fuzz_settings()
@given(create_statements())
def test_generated_statements_parse_to_what_they_were_built_from(case: tuple[str, CreateJob]) -> None:
    text, expected = case
    assert is_job_statement(text)
    assert parse_job_statement(text) == expected


def _check_split(script: str) -> None:
    try:
        statements = split_script(script)
    except ParseError as exc:
        refused: ParseError | None = exc
    else:
        refused = None
    if refused is not None:
        assert refused.position is not None
        assert refused.position.line >= 1
        assert str(refused)
        assert "\n" not in str(refused)
        return
    assert [s.number for s in statements] == list(range(1, len(statements) + 1))
    assert [s.line for s in statements] == sorted(s.line for s in statements)
    offset = 0
    for statement in statements:
        assert statement.text
        assert statement.text == statement.text.strip()
        found = _find_on_line(script, statement.text, offset, statement.line)
        assert found >= 0, (statement, script)  # each statement is a piece of the script, in order, on its line
        offset = found + len(statement.text)


def _find_on_line(script: str, text: str, offset: int, line: int) -> int:
    """Where ``text`` occurs after ``offset`` starting on ``line`` (the same text may also occur earlier,
    inside a comment that swallowed it), or -1."""
    found = script.find(text, offset)
    while found >= 0 and script.count("\n", 0, found) + 1 < line:
        found = script.find(text, found + 1)
    return found if found >= 0 and script.count("\n", 0, found) + 1 == line else -1


@fuzz_settings()
@given(st.text(SQL_ALPHABET + "ab;\n", max_size=300))
def test_script_splitter_cuts_pieces_of_the_script_or_names_the_unterminated_part(script: str) -> None:
    _check_split(script)


@fuzz_settings()
@given(st.lists(st.one_of(st.sampled_from(VALID), st.sampled_from(PLAIN_SQL), mutated_statements()),
                min_size=1, max_size=6),
       st.sampled_from([";\n", "; ", ";\n-- c\n", ";/* x */"]))
def test_scripts_mixing_job_ddl_and_sql_split_at_statement_boundaries(parts: list[str], glue: str) -> None:
    script = glue.join(parts)
    _check_split(script)
    try:
        statements = split_script(script)
    except ParseError:
        return
    for statement in statements:
        if is_job_statement(statement.text):
            parses_or_fails_cleanly(statement.text)
