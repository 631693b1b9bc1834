"""Tokenizer for job DDL, following PostgreSQL's lexical rules (scan.l) for the subset the parser needs."""

from __future__ import annotations

import bisect
import enum
import functools
import re
from dataclasses import dataclass

from radixjobs.errors import ParseError
from radixjobs.model import SourcePosition

MAX_IDENTIFIER_BYTES = 63  # PostgreSQL's NAMEDATALEN - 1


class TokenKind(enum.Enum):
    IDENT = "identifier"  # unquoted, folded to lower case
    QUOTED_IDENT = "quoted identifier"
    STRING = "string literal"  # '...', E'...', $tag$...$tag$; ``value`` holds the content
    NUMBER = "numeric literal"
    OPERATOR = "operator"  # a run of PostgreSQL operator characters, including "-" and "=>"
    PUNCT = "punctuation"  # ( ) [ ] , ; . : ::
    PARAM = "parameter"  # $1
    EOF = "end of input"


@dataclass(frozen=True, slots=True)
class Token:
    kind: TokenKind
    text: str  # the source text
    value: str  # identifier folded / string content / the text otherwise
    position: SourcePosition

    def is_keyword(self, *words: str) -> bool:
        """True for an unquoted identifier equal to one of ``words`` (lower case)."""
        return self.kind is TokenKind.IDENT and self.value in words

    def is_punct(self, *marks: str) -> bool:
        return self.kind in (TokenKind.PUNCT, TokenKind.OPERATOR) and self.text in marks

    def describe(self) -> str:
        """How an error message shows the token: quoted source text, or 'end of input'."""
        if self.kind is TokenKind.EOF:
            return "end of input"
        text = self.text if len(self.text) <= 40 else self.text[:39] + "…"
        return f"'{text}'"


_WHITESPACE = " \t\n\r\f\v"
_IDENT_START = re.compile(r"[A-Za-z_]")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
_NUMBER = re.compile(r"(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NUMBER_JUNK = re.compile(r"[A-Za-z_0-9$.]")
_DOLLAR_TAG = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*)?\$")
_PARAM = re.compile(r"\$[0-9]+")
_OPERATOR_CHARS = "~!@#^&|`?+-*/%<>="
_OPERATOR_KEEPS_SIGN = set("~!@#^&|`?%")
_PUNCT = "()[],;.:"
# Possessive, so that an unterminated literal ending in a doubled quote is not cut short by backtracking.
_PLAIN_BODY = re.compile(r"(?:[^']|'')*+'")
_ESCAPED_BODY = re.compile(r"(?:[^'\\]|\\.|'')*+'", re.DOTALL)
_QUOTED_BODY = re.compile(r'(?:[^"]|"")*+"')
_COMMENT_MARK = re.compile(r"/\*|\*/")
_SIMPLE_ESCAPES = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9A-Fa-f]{1,2})|u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|(.))", re.DOTALL)


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    @functools.cached_property
    def line_starts(self) -> list[int]:
        return [0] + [m.end() for m in re.finditer("\n", self.text)]

    def position(self, offset: int) -> SourcePosition:
        line = bisect.bisect_right(self.line_starts, offset)
        return SourcePosition(line, offset - self.line_starts[line - 1] + 1)

    def fail(self, message: str, offset: int, token: str | None = None) -> ParseError:
        return ParseError(message, self.position(offset), token)

    def skip_space_and_comments(self) -> None:
        text = self.text
        while self.pos < len(text):
            if text[self.pos] in _WHITESPACE:
                self.pos += 1
            elif text.startswith("--", self.pos):
                newline = text.find("\n", self.pos)
                self.pos = len(text) if newline < 0 else newline + 1
            elif text.startswith("/*", self.pos):
                self.pos = self._comment_end(self.pos)
            else:
                return

    def _comment_end(self, start: int) -> int:
        """Offset after the (possibly nested) block comment starting at ``start``."""
        depth = 0
        for mark in _COMMENT_MARK.finditer(self.text, start):
            depth += 1 if mark.group() == "/*" else -1
            if depth == 0:
                return mark.end()
        raise self.fail("unterminated /* comment", start, "/*")

    def next_token(self) -> Token:
        self.skip_space_and_comments()
        start, text = self.pos, self.text
        if start >= len(text):
            return Token(TokenKind.EOF, "", "", self.position(start))
        char = text[start]
        if char == "'":
            return self._string(start, start, escapes=False)
        if char == '"':
            return self._quoted_ident(start)
        if _IDENT_START.match(char):
            return self._word(start)
        if _NUMBER.match(text, start):
            return self._number(start)
        if char == "$":
            return self._dollar(start)
        if text.startswith("::", start):
            return self._emit(TokenKind.PUNCT, start, start + 2)
        if char in _PUNCT:
            return self._emit(TokenKind.PUNCT, start, start + 1)
        if char in _OPERATOR_CHARS:
            return self._operator(start)
        raise self.fail(f"unexpected character {char!r}", start, char)

    def _emit(self, kind: TokenKind, start: int, end: int, value: str | None = None) -> Token:
        self.pos = end
        source = self.text[start:end]
        return Token(kind, source, source if value is None else value, self.position(start))

    def _word(self, start: int) -> Token:
        match = _IDENT.match(self.text, start)
        assert match is not None
        word, end = match.group(), match.end()
        prefix = word.lower()
        if self.text.startswith("'", end) and prefix in ("e", "b", "x", "n"):
            if prefix == "e":
                return self._string(start, end, escapes=True)
            kind = "national character" if prefix == "n" else "bit-string"
            raise self.fail(f"{kind} literals ({word}'...') are not supported", start, word + "'")
        if prefix == "u" and self.text.startswith(("&'", '&"'), end):
            raise self.fail("Unicode escape literals (U&'...') are not supported", start, word + "&")
        self._check_length(word, start)
        return self._emit(TokenKind.IDENT, start, end, prefix)

    def _check_length(self, name: str, start: int) -> None:
        if len(name.encode()) > MAX_IDENTIFIER_BYTES:
            shown = name if len(name) <= 20 else name[:19] + "…"
            raise self.fail(f"identifier '{shown}' is longer than {MAX_IDENTIFIER_BYTES} bytes", start, shown)

    def _quoted_ident(self, start: int) -> Token:
        end = self._closing_quote(start, _QUOTED_BODY, "unterminated quoted identifier", start)
        name = self.text[start + 1 : end - 1].replace('""', '"')
        if not name:
            raise self.fail('zero-length quoted identifier ("")', start, '""')
        if "\0" in name:
            raise self.fail("quoted identifier contains a NUL character", start, None)
        self._check_length(name, start)
        return self._emit(TokenKind.QUOTED_IDENT, start, end, name)

    def _closing_quote(self, quote: int, body: re.Pattern[str], unterminated: str, start: int) -> int:
        """Offset after the closing quote of the literal whose opening quote is at ``quote``."""
        match = body.match(self.text, quote + 1)
        if match is None:
            raise self.fail(unterminated, start, self.text[start : start + 10])
        return match.end()

    def _string(self, start: int, quote: int, escapes: bool) -> Token:
        """A '...' or E'...' literal, with PostgreSQL's continuation of literals separated by a newline."""
        value, end = "", quote
        while True:
            body_pattern = _ESCAPED_BODY if escapes else _PLAIN_BODY
            close = self._closing_quote(end, body_pattern, "unterminated string literal", start)
            body = self.text[end + 1 : close - 1]
            value += self._unescape(body, end) if escapes else body.replace("''", "'")
            gap = re.match(r"[ \t\f\v\r]*\n[ \t\n\r\f\v]*'", self.text[close:])
            if gap is None:
                break
            end = close + gap.end() - 1
        if "\0" in value:
            shown = self.text[start:close][:20]
            raise self.fail("string literals cannot contain NUL characters", start, shown)
        return self._emit(TokenKind.STRING, start, close, value)

    def _unescape(self, body: str, quote: int) -> str:
        """Resolve E'...' escapes; octal and hex escapes are bytes, so the result must be valid UTF-8."""
        out = bytearray()
        pos = 0
        for match in _ESCAPE.finditer(body):
            out += body[pos : match.start()].replace("''", "'").encode()
            out += self._escape_bytes(match, quote)
            pos = match.end()
        out += body[pos:].replace("''", "'").encode()
        try:
            return out.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail("invalid byte sequence for encoding \"UTF8\" in E'...' literal", quote) from None

    def _escape_bytes(self, match: re.Match[str], quote: int) -> bytes:
        octal, hexa, short, long, other = match.groups()
        if octal is not None or hexa is not None:
            return bytes([int(octal, 8) & 0xFF if octal is not None else int(hexa, 16)])
        if short is not None or long is not None:
            code = int(short or long, 16)
            if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise self.fail("invalid Unicode escape value", quote, match.group())
            return chr(code).encode()
        return _SIMPLE_ESCAPES.get(other, other).encode()

    def _number(self, start: int) -> Token:
        match = _NUMBER.match(self.text, start)
        assert match is not None
        end = match.end()
        if _NUMBER_JUNK.match(self.text, end):
            raise self.fail("trailing junk after numeric literal", start, self.text[start : end + 1])
        return self._emit(TokenKind.NUMBER, start, end)

    def _dollar(self, start: int) -> Token:
        param = _PARAM.match(self.text, start)
        if param is not None:
            return self._emit(TokenKind.PARAM, start, param.end())
        tag = _DOLLAR_TAG.match(self.text, start)
        if tag is None:
            raise self.fail("unexpected character '$'", start, "$")
        close = self.text.find(tag.group(), tag.end())
        if close < 0:
            raise self.fail("unterminated dollar-quoted string", start, tag.group())
        return self._emit(TokenKind.STRING, start, close + len(tag.group()), self.text[tag.end() : close])

    def _operator(self, start: int) -> Token:
        end = start
        while end < len(self.text) and self.text[end] in _OPERATOR_CHARS:
            if self.text.startswith(("--", "/*"), end) and end > start:
                break
            end += 1
        # As scan.l: a multi-character operator does not end in + or - unless it has one of ~!@#%^&|`?
        if not _OPERATOR_KEEPS_SIGN.intersection(self.text[start:end]):
            while end - start > 1 and self.text[end - 1] in "+-":
                end -= 1
        return self._emit(TokenKind.OPERATOR, start, end)


def tokenize(text: str) -> list[Token]:
    """All tokens of ``text``, ending with one EOF token; ParseError on a lexical error."""
    scanner = _Scanner(text)
    try:
        text.encode()
    except UnicodeEncodeError as exc:  # a lone surrogate cannot come from UTF-8 SQL text
        raise scanner.fail(f"invalid character {text[exc.start]!r}", exc.start, None) from None
    tokens = [scanner.next_token()]
    while tokens[-1].kind is not TokenKind.EOF:
        tokens.append(scanner.next_token())
    return tokens


class TokenStream:
    """A cursor over the tokens of one statement, with the expect/accept helpers a parser needs."""

    def __init__(self, text: str) -> None:
        self.tokens = tokenize(text)
        self.index = 0

    @property
    def token(self) -> Token:
        return self.tokens[self.index]

    def peek(self, ahead: int = 1) -> Token:
        return self.tokens[min(self.index + ahead, len(self.tokens) - 1)]

    def advance(self) -> Token:
        """The current token; moves on (staying on the final EOF token)."""
        token = self.token
        self.index = min(self.index + 1, len(self.tokens) - 1)
        return token

    def fail(self, message: str, token: Token | None = None) -> ParseError:
        token = token or self.token
        shown = None if token.kind is TokenKind.EOF else token.text[:40]
        return ParseError(message, token.position, shown)

    def expected(self, what: str) -> ParseError:
        return self.fail(f"expected {what}, found {self.token.describe()}")

    def expect(self, word: str, what: str | None = None) -> Token:
        if not self.token.is_keyword(word):
            raise self.expected(what or word.upper())
        return self.advance()

    def accept(self, *words: str) -> Token | None:
        return self.advance() if self.token.is_keyword(*words) else None

    def expect_punct(self, mark: str, what: str) -> Token:
        if not self.token.is_punct(mark):
            raise self.expected(what)
        return self.advance()

    def string_literal(self, what: str) -> Token:
        if self.token.kind is not TokenKind.STRING:
            raise self.expected(what)
        return self.advance()

    def identifier(self, what: str) -> Token:
        if self.token.kind not in (TokenKind.IDENT, TokenKind.QUOTED_IDENT):
            raise self.expected(what)
        return self.advance()


_JOB_STATEMENT_STARTS: tuple[tuple[str, ...], ...] = (
    ("create", "job"),
    ("create", "or", "replace", "job"),
    ("alter", "job"),
    ("drop", "job"),
    ("run", "job"),
)


def is_job_statement(text: str) -> bool:
    """Whether ``text`` starts (after whitespace and comments) with CREATE [OR REPLACE] JOB, ALTER JOB,
    DROP JOB or RUN JOB; cheap, and never raises."""
    scanner = _Scanner(text)
    words: list[str] = []
    try:
        while len(words) < 4:
            scanner.skip_space_and_comments()
            match = _IDENT.match(text, scanner.pos)
            if match is None:
                break
            words.append(match.group().lower())
            scanner.pos = match.end()
            if tuple(words) in _JOB_STATEMENT_STARTS:
                return True
    except ParseError:  # an unterminated comment
        return False
    return False
