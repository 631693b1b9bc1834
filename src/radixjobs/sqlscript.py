"""Split a PostgreSQL script into statements the way psql does: pure, no I/O.

The scanner follows psql's lexer (``src/fe_utils/psqlscan.l``) as far as statement boundaries go:

- ``'…'`` strings (``''`` doubles a quote; ``standard_conforming_strings`` is assumed on, so a
  backslash is literal), ``E'…'`` strings (backslash escapes), ``U&'…'``, ``B'…'``, ``X'…'``,
  ``N'…'``, and SQL-standard continuation of a string across a newline (``E'a'\\n'b\\'c'`` is one
  string, so the backslash rules of the first part apply to the second);
- ``"quoted identifiers"`` and ``U&"…"`` (``""`` doubles a quote);
- dollar quoting ``$$…$$`` / ``$tag$…$tag$``, where a tag starts with a letter or underscore:
  ``$1`` is a parameter and ``a$b`` one identifier, as in PostgreSQL;
- ``-- line comments`` and nested ``/* /* */ */`` block comments;
- parentheses: a ``;`` inside ``( … )`` does not end the statement;
- SQL-standard routine bodies: in a statement that starts ``CREATE [OR REPLACE] FUNCTION|PROCEDURE``,
  ``BEGIN`` (and ``CASE`` inside it) opens and ``END`` closes a block, and a ``;`` inside a block does
  not end the statement (psql's heuristic, kept exactly, including its blind spots).

A statement's text runs from the start of its first token to the end of its last one: the terminating
``;``, surrounding whitespace and comments before the first or after the last token are left out,
comments between its tokens are kept. Statements that are empty or consist only of comments are
dropped and not numbered; ``line`` is where the first token starts.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from radixjobs.errors import ParseError
from radixjobs.model import ScriptStatement, SourcePosition

# PostgreSQL treats every byte >= 0x80 as a letter; for text that means every non-ASCII character.
_LETTER = "A-Za-z_\u0080-\U0010ffff"
_WHITESPACE = frozenset(" \t\n\r\f\v")
_IDENT_START = re.compile(f"[{_LETTER}]")
_IDENT_REST = re.compile(f"[{_LETTER}0-9$]*+")
_NUMBER = re.compile(f"[0-9][0-9_.]*+(?:[{_LETTER}][{_LETTER}0-9$]*+)?")
_DOLLAR_QUOTE = re.compile(f"\\$(?:[{_LETTER}][{_LETTER}0-9]*+)?\\$")
_PARAMETER = re.compile(r"\$[0-9]++")
_QUOTE = re.compile("'")
_QUOTE_OR_BACKSLASH = re.compile(r"['\\]")
_COMMENT_DELIMITER = re.compile(r"/\*|\*/")
_LINE_END = re.compile(r"[\n\r]")
# A string continues after its closing quote when only whitespace with a newline (and -- comments)
# separates it from the next quote: psql's {quotecontinue}.
_QUOTE_CONTINUE = re.compile(r"(?:[ \t\f\v]|--[^\n\r]*+)*+[\n\r](?:[ \t\n\r\f\v]++|--[^\n\r]*+[\n\r])*+'")
# prefix -> (opener, what PostgreSQL calls the literal when it is not closed)
_STRING_PREFIXES = {
    "e": ("E'", "quoted string"),
    "b": ("B'", "bit string literal"),
    "x": ("X'", "hexadecimal string literal"),
    "n": ("N'", "quoted string"),
}
_QUOTED_STRING = "quoted string"
# Words whose first letter psql remembers to recognise CREATE [OR REPLACE] FUNCTION|PROCEDURE.
_HEADER_WORDS = frozenset({"create", "function", "procedure", "or", "replace"})
_HEADER_SLOTS = 4


def split_script(text: str) -> list[ScriptStatement]:
    """Statements of ``text`` in order; raises ParseError on an unterminated quote or comment."""
    return _Splitter(text).run()


@dataclass
class _Splitter:
    """One pass over the script; ``pos`` only moves forward."""

    text: str
    pos: int = 0
    statement_start: int | None = None
    statement_end: int = 0
    paren_depth: int = 0
    begin_depth: int = 0
    word_count: int = 0
    header: list[str] = field(default_factory=lambda: [""] * _HEADER_SLOTS)
    statements: list[ScriptStatement] = field(default_factory=list)
    _line_starts: list[int] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", self.text)]

    def run(self) -> list[ScriptStatement]:
        text = self.text
        while self.pos < len(text):
            char = text[self.pos]
            if char in _WHITESPACE:
                self.pos += 1
            elif text.startswith("--", self.pos):
                self._skip_line_comment()
            elif text.startswith("/*", self.pos):
                self._skip_block_comment()
            elif char == ";" and self.paren_depth == 0 and self.begin_depth == 0:
                self._finish_statement()
                self.pos += 1
            else:
                if self.statement_start is None:
                    self.statement_start = self.pos
                self._scan_token(char)
                self.statement_end = self.pos
        self._finish_statement()
        return self.statements

    # -- statements --------------------------------------------------------------------------

    def _finish_statement(self) -> None:
        start = self.statement_start
        self.statement_start = None
        self.paren_depth = self.begin_depth = self.word_count = 0
        if start is None:
            return
        self.statements.append(
            ScriptStatement(
                text=self.text[start : self.statement_end],
                number=len(self.statements) + 1,
                line=self._position(start).line,
            )
        )

    def _position(self, offset: int) -> SourcePosition:
        line_index = bisect.bisect_right(self._line_starts, offset) - 1
        return SourcePosition(line_index + 1, offset - self._line_starts[line_index] + 1)

    def _unterminated(self, construct: str, start: int, opener: str) -> ParseError:
        return ParseError(f"unterminated {construct}", self._position(start), opener)

    # -- tokens ------------------------------------------------------------------------------

    def _scan_token(self, char: str) -> None:
        if char == "(":
            self.paren_depth += 1
            self.pos += 1
        elif char == ")":
            self.paren_depth = max(self.paren_depth - 1, 0)
            self.pos += 1
        elif char == "'":
            self._scan_string(self.pos, self.pos + 1, "'", _QUOTED_STRING, escapes=False)
        elif char == '"':
            self._scan_quoted_identifier(self.pos, self.pos + 1, '"')
        elif char == "$":
            self._scan_dollar()
        elif _IDENT_START.match(char):
            self._scan_word()
        elif char.isascii() and char.isdigit():
            match = _NUMBER.match(self.text, self.pos)
            assert match is not None  # a digit always matches
            self.pos = match.end()
        else:
            self.pos += 1

    def _scan_word(self) -> None:
        """An identifier or keyword, or the prefix of E'', U&'', U&"", B'', X'', N''."""
        start = self.pos
        end = _IDENT_REST.match(self.text, start + 1)
        assert end is not None  # the pattern matches the empty string
        word = self.text[start : end.end()]
        folded = word.lower() if word.isascii() else word
        after = self.text[end.end() : end.end() + 2]
        if folded in _STRING_PREFIXES and after[:1] == "'":
            opener, construct = _STRING_PREFIXES[folded]
            self._scan_string(start, end.end() + 1, opener, construct, escapes=folded == "e")
        elif folded == "u" and after == "&'":
            self._scan_string(start, end.end() + 2, "U&'", _QUOTED_STRING, escapes=False)
        elif folded == "u" and after == '&"':
            self._scan_quoted_identifier(start, end.end() + 2, 'U&"')
        else:
            self.pos = end.end()
            self._track_word(folded)

    def _track_word(self, folded: str) -> None:
        """psql's BEGIN/END depth heuristic for SQL-standard function and procedure bodies."""
        if self.word_count == 0:
            self.header = [""] * _HEADER_SLOTS
        if folded in _HEADER_WORDS and self.word_count < _HEADER_SLOTS:
            self.header[self.word_count] = folded[0]
        self.word_count += 1
        if not self._in_routine_definition() or self.paren_depth != 0:
            return
        if folded == "begin" or (folded == "case" and self.begin_depth >= 1):
            self.begin_depth += 1
        elif folded == "end" and self.begin_depth > 0:
            self.begin_depth -= 1

    def _in_routine_definition(self) -> bool:
        first, second, third, fourth = self.header
        return first == "c" and (
            second in ("f", "p") or (second == "o" and third == "r" and fourth in ("f", "p"))
        )

    # -- quoted constructs -------------------------------------------------------------------

    def _scan_string(self, start: int, body: int, opener: str, construct: str, *, escapes: bool) -> None:
        """A string literal from its opener at ``start``; the body begins at ``body``."""
        text = self.text
        special = _QUOTE_OR_BACKSLASH if escapes else _QUOTE
        pos = body
        while True:
            match = special.search(text, pos)
            if match is None:
                raise self._unterminated(construct, start, opener)
            at = match.start()
            if match.group() == "\\" or text.startswith("''", at):
                pos = at + 2  # an escaped character, or a doubled quote
                continue
            continuation = _QUOTE_CONTINUE.match(text, at + 1)
            if continuation is None:
                self.pos = at + 1
                return
            pos = continuation.end()

    def _scan_quoted_identifier(self, start: int, body: int, opener: str) -> None:
        text = self.text
        pos = body
        while True:
            quote = text.find('"', pos)
            if quote < 0:
                raise self._unterminated("quoted identifier", start, opener)
            if not text.startswith('""', quote):
                self.pos = quote + 1
                return
            pos = quote + 2

    def _scan_dollar(self) -> None:
        """A dollar-quoted string, a ``$n`` parameter, or a lone ``$``."""
        start = self.pos
        delimiter = _DOLLAR_QUOTE.match(self.text, start)
        if delimiter is None:
            parameter = _PARAMETER.match(self.text, start)
            self.pos = start + 1 if parameter is None else parameter.end()
            return
        closing = self.text.find(delimiter.group(), delimiter.end())
        if closing < 0:
            raise self._unterminated("dollar-quoted string", start, delimiter.group())
        self.pos = closing + len(delimiter.group())

    # -- comments ----------------------------------------------------------------------------

    def _skip_line_comment(self) -> None:
        end = _LINE_END.search(self.text, self.pos)
        self.pos = len(self.text) if end is None else end.end()

    def _skip_block_comment(self) -> None:
        start = self.pos
        depth = 1
        pos = start + 2
        while depth:
            delimiter = _COMMENT_DELIMITER.search(self.text, pos)
            if delimiter is None:
                raise self._unterminated("/* comment", start, "/*")
            depth += 1 if delimiter.group() == "/*" else -1
            pos = delimiter.end()
        self.pos = pos
