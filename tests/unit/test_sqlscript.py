"""split_script: psql-compatible statement splitting."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixjobs.errors import ParseError
from radixjobs.model import ScriptStatement, SourcePosition
from radixjobs.sqlscript import split_script


def texts(script: str) -> list[str]:
    return [s.text for s in split_script(script)]


SPLITS: list[tuple[str, str, list[str]]] = [
    ("empty", "", []),
    ("whitespace only", " \n\t \r\n", []),
    ("semicolons only", ";;\n ; ;", []),
    ("one statement", "SELECT 1;", ["SELECT 1"]),
    ("trailing statement without semicolon", "SELECT 1; SELECT 2", ["SELECT 1", "SELECT 2"]),
    ("surrounding whitespace stripped", "  \n SELECT 1 \n ;\n", ["SELECT 1"]),
    ("empty statements skipped", "SELECT 1;; ;SELECT 2;", ["SELECT 1", "SELECT 2"]),
    ("multi-line statement kept verbatim", "SELECT\n  1,\n  2;", ["SELECT\n  1,\n  2"]),
    # strings
    ("string with semicolon", "SELECT 'a;b'; SELECT 2", ["SELECT 'a;b'", "SELECT 2"]),
    ("doubled quote", "SELECT 'it''s;'; SELECT 2", ["SELECT 'it''s;'", "SELECT 2"]),
    ("empty string", "SELECT '';SELECT ''''", ["SELECT ''", "SELECT ''''"]),
    ("backslash literal in standard string", r"SELECT 'a\'; SELECT 2", [r"SELECT 'a\'", "SELECT 2"]),
    ("E string backslash quote", r"SELECT E'it\'s;'; SELECT 2", [r"SELECT E'it\'s;'", "SELECT 2"]),
    ("lower-case e string", r"SELECT e'\';'; SELECT 2", [r"SELECT e'\';'", "SELECT 2"]),
    ("E string escaped backslash", r"SELECT E'a\\'; SELECT 2", [r"SELECT E'a\\'", "SELECT 2"]),
    ("E string doubled quote", "SELECT E'a'';'; SELECT 2", ["SELECT E'a'';'", "SELECT 2"]),
    ("identifier ending in e is no prefix", r"SELECT xe'a\'; SELECT 2", [r"SELECT xe'a\'", "SELECT 2"]),
    ("number ending in e is no prefix", r"SELECT 1e'a\'; SELECT 2", [r"SELECT 1e'a\'", "SELECT 2"]),
    ("U& string", "SELECT U&'d\\0061t;'; SELECT 2", ["SELECT U&'d\\0061t;'", "SELECT 2"]),
    ("U& string doubled quote", "SELECT u&'a'';'; SELECT 2", ["SELECT u&'a'';'", "SELECT 2"]),
    (
        "bit, hex and national strings",
        "SELECT B'1;', X'f;', N'n;'; SELECT 2",
        ["SELECT B'1;', X'f;', N'n;'", "SELECT 2"],
    ),
    ("string continued on next line", "SELECT 'a'\n';'; SELECT 2", ["SELECT 'a'\n';'", "SELECT 2"]),
    (
        "E string continuation keeps escapes",
        "SELECT E'a'\n'\\';'; SELECT 2",
        ["SELECT E'a'\n'\\';'", "SELECT 2"],
    ),
    (
        "E string continuation across comment line",
        "SELECT E'a' -- c\n -- d\n '\\';'; SELECT 2",
        ["SELECT E'a' -- c\n -- d\n '\\';'", "SELECT 2"],
    ),
    (
        "no continuation on the same line",
        "SELECT E'a' 'b\\'; SELECT 2",
        ["SELECT E'a' 'b\\'", "SELECT 2"],
    ),
    # quoted identifiers
    ("quoted identifier with semicolon", 'SELECT 1 AS "a;b"; SELECT 2', ['SELECT 1 AS "a;b"', "SELECT 2"]),
    ("quoted identifier doubled quote", 'SELECT 1 AS "a"";"; SELECT 2', ['SELECT 1 AS "a"";"', "SELECT 2"]),
    ("quote inside identifier", "SELECT 1 AS \"it's;\"; SELECT 2", ["SELECT 1 AS \"it's;\"", "SELECT 2"]),
    ("U& identifier", 'SELECT 1 AS U&"a;"; SELECT 2', ['SELECT 1 AS U&"a;"', "SELECT 2"]),
    # dollar quoting
    ("dollar quote", "SELECT $$a;b$$; SELECT 2", ["SELECT $$a;b$$", "SELECT 2"]),
    ("tagged dollar quote", "SELECT $fn$ $$;$$ $fn$; SELECT 2", ["SELECT $fn$ $$;$$ $fn$", "SELECT 2"]),
    (
        "dollar quote holds quotes",
        "SELECT $$ ' \" -- /* ; $$; SELECT 2",
        ["SELECT $$ ' \" -- /* ; $$", "SELECT 2"],
    ),
    ("tag is case-sensitive", "SELECT $a$ $A$; $a$; SELECT 2", ["SELECT $a$ $A$; $a$", "SELECT 2"]),
    ("underscore tag", "SELECT $_x1$;$_x1$;SELECT 2", ["SELECT $_x1$;$_x1$", "SELECT 2"]),
    ("closing tag inside longer tag", "SELECT $a$ $b$a$;SELECT 2", ["SELECT $a$ $b$a$", "SELECT 2"]),
    ("parameter is not a dollar quote", "SELECT $1; SELECT $2", ["SELECT $1", "SELECT $2"]),
    ("digit-led tag is a parameter", "SELECT $1$; SELECT 2", ["SELECT $1$", "SELECT 2"]),
    ("dollar inside identifier", "SELECT a$b$; SELECT 2", ["SELECT a$b$", "SELECT 2"]),
    ("identifier then dollar words", "SELECT x$ $y; SELECT 2", ["SELECT x$ $y", "SELECT 2"]),
    ("lone dollar", "SELECT $ ; SELECT 2", ["SELECT $", "SELECT 2"]),
    ("number then dollar quote", "SELECT 1$a$;$a$; SELECT 2", ["SELECT 1$a$;$a$", "SELECT 2"]),
    ("non-ASCII tag", "SELECT $é$;$é$; SELECT 2", ["SELECT $é$;$é$", "SELECT 2"]),
    # comments
    ("line comment with semicolon", "SELECT 1 -- a;b\n, 2; SELECT 3", ["SELECT 1 -- a;b\n, 2", "SELECT 3"]),
    ("line comment ends at CR", "SELECT 1 -- a;b\r, 2; SELECT 3", ["SELECT 1 -- a;b\r, 2", "SELECT 3"]),
    ("block comment", "SELECT /* ; */ 1; SELECT 2", ["SELECT /* ; */ 1", "SELECT 2"]),
    ("nested block comment", "SELECT /* /* ; */ ; */ 1; SELECT 2", ["SELECT /* /* ; */ ; */ 1", "SELECT 2"]),
    ("block comment quotes inert", "SELECT /* ' \" $$ */ 1;SELECT 2", ["SELECT /* ' \" $$ */ 1", "SELECT 2"]),
    ("comment after operator", "SELECT 1+--x;\n2; SELECT 3", ["SELECT 1+--x;\n2", "SELECT 3"]),
    ("block comment glued to operator", "SELECT 2*/*;*/3; SELECT 4", ["SELECT 2*/*;*/3", "SELECT 4"]),
    ("slash-star-slash", "SELECT /*/ ; */ 1; SELECT 2", ["SELECT /*/ ; */ 1", "SELECT 2"]),
    ("leading comments dropped", "-- head\n/* b */ SELECT 1;", ["SELECT 1"]),
    ("comment after semicolon belongs to nobody", "SELECT 1; -- tail\nSELECT 2;", ["SELECT 1", "SELECT 2"]),
    ("comment-only statements dropped", "-- a\n;/* b */;\n-- c", []),
    ("trailing comments dropped", "SELECT 1 /* t */ -- u\n;", ["SELECT 1"]),
    ("trailing comment of last statement dropped", "SELECT 1 -- done", ["SELECT 1"]),
    ("comment between tokens kept", "SELECT /* a */ 1 -- b\n + 2 ;", ["SELECT /* a */ 1 -- b\n + 2"]),
    ("comment-like text in string", "SELECT '--;', '/*;'; SELECT 2", ["SELECT '--;', '/*;'", "SELECT 2"]),
    # parentheses
    ("semicolon inside parentheses", "SELECT (1;2); SELECT 3", ["SELECT (1;2)", "SELECT 3"]),
    ("unbalanced close parenthesis ignored", "SELECT 1); SELECT 2", ["SELECT 1)", "SELECT 2"]),
    ("unclosed parenthesis runs to the end", "SELECT (1; SELECT 2", ["SELECT (1; SELECT 2"]),
    # SQL-standard routine bodies
    (
        "create function begin atomic",
        "CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; SELECT 2; END; SELECT 3",
        ["CREATE FUNCTION f() RETURNS int LANGUAGE sql BEGIN ATOMIC SELECT 1; SELECT 2; END", "SELECT 3"],
    ),
    (
        "create or replace procedure",
        "create or replace procedure p() begin atomic insert into t values (1); end;select 3",
        ["create or replace procedure p() begin atomic insert into t values (1); end", "select 3"],
    ),
    (
        "case inside body",
        "CREATE FUNCTION f(x int) RETURNS int BEGIN ATOMIC SELECT CASE WHEN x > 0 THEN 1 END; "
        "SELECT 2; END; SELECT 3",
        ["CREATE FUNCTION f(x int) RETURNS int BEGIN ATOMIC SELECT CASE WHEN x > 0 THEN 1 END; SELECT 2; END",
         "SELECT 3"],
    ),
    (
        "nested begin",
        "CREATE PROCEDURE p() BEGIN ATOMIC BEGIN ATOMIC SELECT 1; END; SELECT 2; END; SELECT 3",
        ["CREATE PROCEDURE p() BEGIN ATOMIC BEGIN ATOMIC SELECT 1; END; SELECT 2; END", "SELECT 3"],
    ),
    (
        "mixed-case keywords",
        "Create Or Replace Function f() Returns int Begin Atomic Select 1; End; Select 2",
        ["Create Or Replace Function f() Returns int Begin Atomic Select 1; End", "Select 2"],
    ),
    (
        "case outside begin does not count",
        "CREATE FUNCTION f() RETURNS int RETURN CASE WHEN true THEN 1 END; SELECT 2",
        ["CREATE FUNCTION f() RETURNS int RETURN CASE WHEN true THEN 1 END", "SELECT 2"],
    ),
    (
        "begin inside parentheses does not count",
        "CREATE FUNCTION f(begin int) RETURNS int RETURN 1; SELECT 2",
        ["CREATE FUNCTION f(begin int) RETURNS int RETURN 1", "SELECT 2"],
    ),
    (
        "dollar-quoted plpgsql body",
        "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN 1; END $$; SELECT 2",
        ["CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN 1; END $$", "SELECT 2"],
    ),
    ("transaction begin is a statement", "BEGIN; SELECT 1; END;", ["BEGIN", "SELECT 1", "END"]),
    ("do block", "DO $$BEGIN PERFORM 1; END$$; SELECT 2", ["DO $$BEGIN PERFORM 1; END$$", "SELECT 2"]),
    (
        "create table is no routine",
        "CREATE TABLE begin_t (a int); BEGIN; SELECT 1",
        ["CREATE TABLE begin_t (a int)", "BEGIN", "SELECT 1"],
    ),
    (
        "quoted begin does not count",
        'CREATE FUNCTION "begin"() RETURNS int RETURN 1; SELECT 2',
        ['CREATE FUNCTION "begin"() RETURNS int RETURN 1', "SELECT 2"],
    ),
    (
        "routine state resets per statement",
        "CREATE FUNCTION f() RETURNS int RETURN 1; SELECT 1 FROM begin_x; BEGIN; SELECT 2",
        ["CREATE FUNCTION f() RETURNS int RETURN 1", "SELECT 1 FROM begin_x", "BEGIN", "SELECT 2"],
    ),
    ("non-ASCII identifier", "SELECT 1 AS ñ; SELECT 2", ["SELECT 1 AS ñ", "SELECT 2"]),
]


@pytest.mark.parametrize(("script", "expected"), [(s, e) for _, s, e in SPLITS], ids=[n for n, *_ in SPLITS])
def test_split_texts(script: str, expected: list[str]) -> None:
    assert texts(script) == expected


def test_numbers_and_lines() -> None:
    script = "\n-- heading\n\nSELECT 1;\n;\n  /* c\n */ SELECT\n 2; SELECT 3\n\n-- end\n"
    assert split_script(script) == [
        ScriptStatement("SELECT 1", 1, 4),
        ScriptStatement("SELECT\n 2", 2, 7),
        ScriptStatement("SELECT 3", 3, 8),
    ]


def test_line_of_statement_after_multiline_string() -> None:
    script = "SELECT 'a\nb\nc'; SELECT $$\n$$;\nSELECT 3"
    assert [(s.number, s.line) for s in split_script(script)] == [(1, 1), (2, 3), (3, 5)]


def test_crlf_line_numbers() -> None:
    assert [s.line for s in split_script("SELECT 1;\r\n\r\nSELECT 2;\r\n")] == [1, 3]
    assert texts("SELECT 1;\r\nSELECT 2\r\n") == ["SELECT 1", "SELECT 2"]


UNTERMINATED: list[tuple[str, str, str, SourcePosition, str]] = [
    ("string", "SELECT 1;\nSELECT 'abc;", "quoted string", SourcePosition(2, 8), "'"),
    ("string after doubled quote", "SELECT 'a''", "quoted string", SourcePosition(1, 8), "'"),
    ("E string escaped quote", r"SELECT E'it\'s", "quoted string", SourcePosition(1, 8), "E'"),
    ("E string trailing backslash", "SELECT E'a\\", "quoted string", SourcePosition(1, 8), "E'"),
    ("E string continuation", "SELECT E'a'\n  'b", "quoted string", SourcePosition(1, 8), "E'"),
    ("U& string", "SELECT U&'x", "quoted string", SourcePosition(1, 8), "U&'"),
    ("bit string", "SELECT b'1", "bit string literal", SourcePosition(1, 8), "B'"),
    ("hex string", "SELECT X'1", "hexadecimal string literal", SourcePosition(1, 8), "X'"),
    ("national string", "SELECT n'1", "quoted string", SourcePosition(1, 8), "N'"),
    ("quoted identifier", 'SELECT 1 AS "x;', "quoted identifier", SourcePosition(1, 13), '"'),
    ("quoted identifier doubled", 'SELECT 1 AS "x""', "quoted identifier", SourcePosition(1, 13), '"'),
    ("U& identifier", 'SELECT U&"x', "quoted identifier", SourcePosition(1, 8), 'U&"'),
    ("dollar quote", "SELECT 1;\n\n  SELECT $$a;", "dollar-quoted string", SourcePosition(3, 10), "$$"),
    ("tagged dollar quote", "SELECT $fn$ $$ $FN$", "dollar-quoted string", SourcePosition(1, 8), "$fn$"),
    ("block comment", "SELECT 1 /* x", "/* comment", SourcePosition(1, 10), "/*"),
    ("nested block comment", "/* a /* b */ c", "/* comment", SourcePosition(1, 1), "/*"),
    ("leading block comment", "\n  /* a", "/* comment", SourcePosition(2, 3), "/*"),
]


@pytest.mark.parametrize(
    ("script", "construct", "position", "token"),
    [(s, c, p, t) for _, s, c, p, t in UNTERMINATED],
    ids=[n for n, *_ in UNTERMINATED],
)
def test_unterminated(script: str, construct: str, position: SourcePosition, token: str) -> None:
    with pytest.raises(ParseError) as caught:
        split_script(script)
    error = caught.value
    assert error.message == f"unterminated {construct}"
    assert error.position == position
    assert error.token == token
    assert str(position) in str(error)
    assert error.code == "42601"


# -- properties ----------------------------------------------------------------------------------

_WORDS = st.from_regex(r"x[a-z0-9_$]{0,6}", fullmatch=True)
_SAFE_TEXT = st.text(alphabet=st.characters(exclude_characters="\x00", codec="utf-8"), max_size=12)
_DOLLAR_BODY = st.text(alphabet=st.characters(exclude_characters="$\x00", codec="utf-8"), max_size=12)
_TAG = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,4}|", fullmatch=True)

# Fragments that may follow the first token of a statement; each may hold semicolons.
_FRAGMENTS = st.one_of(
    _WORDS,
    st.integers(min_value=0, max_value=10**6).map(str),
    st.sampled_from(["+", "-", "*", "/", "=", "<>", "::", ",", ".", "(", ")", "[1]", "$1", "$23"]),
    # no backslash: after "E'…' -- c\n" a plain string continues the E string (as in psql)
    _SAFE_TEXT.map(lambda s: "'" + s.replace("\\", "").replace("'", "''") + "'"),
    _SAFE_TEXT.map(lambda s: "E'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"),
    _SAFE_TEXT.map(lambda s: "U&'" + s.replace("'", "''") + "'"),
    _SAFE_TEXT.map(lambda s: '"' + s.replace('"', '""') + '"'),
    st.tuples(_TAG, _DOLLAR_BODY).map(lambda t: f"${t[0]}${t[1]}${t[0]}$"),
    _SAFE_TEXT.map(lambda s: "/* " + s.replace("*", "").replace("/", "") + " */"),
    _SAFE_TEXT.map(lambda s: "-- " + s.replace("\n", " ").replace("\r", " ") + "\n"),
)


def _balanced(fragments: list[str]) -> list[str]:
    """Drop close parentheses without an opener and close the rest, so ';' can end the statement."""
    out: list[str] = []
    depth = 0
    for fragment in fragments:
        if fragment == ")" and depth == 0:
            continue
        depth += {"(": 1, ")": -1}.get(fragment, 0)
        out.append(fragment)
    out += [")"] * depth
    # comments after the last token are not part of the statement's text
    return [*out, "x"] if out and out[-1].startswith(("--", "/*")) else out


_STATEMENTS = st.tuples(
    st.one_of(_WORDS, st.sampled_from(["SELECT", "insert", "Values", "1"])),
    st.lists(_FRAGMENTS, max_size=8),
).map(lambda t: " ".join([t[0], *_balanced(t[1])]).strip())
_SEPARATORS = st.sampled_from([";", ";\n", " ; ", ";\n\n", "\n;", ";;", "; -- note\n", ";/* c; */"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_STATEMENTS, _SEPARATORS), max_size=6), st.booleans())
def test_join_then_split_round_trips(parts: list[tuple[str, str]], drop_last_separator: bool) -> None:
    script = ""
    starts: list[int] = []
    for index, (statement, separator) in enumerate(parts):
        starts.append(len(script))
        last = index == len(parts) - 1
        script += statement + ("" if last and drop_last_separator else separator)
    result = split_script(script)
    assert [s.text for s in result] == [p[0] for p in parts]
    assert [s.number for s in result] == list(range(1, len(parts) + 1))
    assert [s.line for s in result] == [script.count("\n", 0, start) + 1 for start in starts]


_NASTY = st.text(alphabet="';\"$-/*\n\\EeUu&ab_1 ()\r", max_size=40)


@settings(max_examples=1000, deadline=None)
@given(st.one_of(_NASTY, st.text(max_size=40)))
def test_arbitrary_input_splits_or_raises_parse_error(script: str) -> None:
    error: ParseError | None = None
    try:
        result = split_script(script)
    except ParseError as caught:
        error, result = caught, []
    if error is not None:
        assert error.position is not None
        assert error.token
    assert [s.number for s in result] == list(range(1, len(result) + 1))
    assert all(s.text and s.text == s.text.strip(" \t\n\r\f\v") for s in result)
    assert [s.line for s in result] == sorted(s.line for s in result)
    assert all(1 <= s.line <= script.count("\n") + 1 for s in result)
