"""Type names in casts and typed literals, as PostgreSQL's grammar spells them (pure)."""

from __future__ import annotations

from radixjobs.ddl.tokens import Token, TokenKind, TokenStream
from radixjobs.model import quote_ident

_INTERVAL_FIELDS = frozenset(["year", "month", "day", "hour", "minute", "second"])
_VARYING_TYPES = frozenset(["character", "char", "nchar", "bit"])


def render(token: Token) -> str:
    return token.value if token.kind is TokenKind.IDENT else quote_ident(token.value)


class TypeNameParser(TokenStream):
    """The type-name part of the job DDL grammar."""

    def type_name(self, allow_array: bool = True) -> str:
        """A type name in normalised text: folded, single-spaced, quoted parts re-quoted."""
        first = self.identifier("a type name")
        parts = [render(first)]
        while self.token.is_punct("."):
            self.advance()
            parts.append(render(self.identifier("a type name after '.'")))
        name = ".".join(parts)
        if len(parts) == 1 and first.kind is TokenKind.IDENT:
            name = self.keyword_type(name)
        name += self.modifiers()
        if parts in (["timestamp"], ["time"]) and first.kind is TokenKind.IDENT:
            name += self.time_zone_suffix()
        return name + self.array_suffix() if allow_array else name

    def time_zone_suffix(self) -> str:
        zone = self.accept("with", "without")
        if zone is None:
            return ""
        self.expect("time", f"TIME after {zone.text.upper()}")
        self.expect("zone", "ZONE after TIME")
        return f" {zone.value} time zone"

    def keyword_type(self, name: str) -> str:
        """The multi-word spellings PostgreSQL's grammar knows (double precision, character varying…)."""
        if name == "double" and self.accept("precision"):
            return "double precision"
        if name == "national" and self.token.is_keyword("character", "char"):
            name += " " + self.advance().value
            return name + (" varying" if self.accept("varying") else "")
        if name in _VARYING_TYPES and self.accept("varying"):
            return name + " varying"
        if name == "interval":
            return name + self.interval_fields()
        return name

    def interval_fields(self) -> str:
        if not self.token.is_keyword(*_INTERVAL_FIELDS):
            return ""
        fields = " " + self.advance().value
        if self.accept("to"):
            if not self.token.is_keyword(*_INTERVAL_FIELDS):
                raise self.expected("an interval field (YEAR … SECOND) after TO")
            fields += " to " + self.advance().value
        return fields

    def modifiers(self) -> str:
        if not self.token.is_punct("("):
            return ""
        self.advance()
        values: list[str] = []
        while True:
            sign = ""
            if self.token.is_punct("-"):
                sign = self.advance().text
            if self.token.kind is not TokenKind.NUMBER or not self.token.text.isdigit():
                raise self.expected("an integer type modifier")
            values.append(sign + self.advance().text)
            if not self.token.is_punct(","):
                break
            self.advance()
        self.expect_punct(")", "')' after the type modifiers")
        return "(" + ",".join(values) + ")"

    def array_suffix(self) -> str:
        suffix = ""
        if self.accept("array"):
            suffix = "[]"
            if self.token.is_punct("["):
                self.bracket_bound()
        while self.token.is_punct("["):
            self.bracket_bound()
            suffix += "[]"
        return suffix

    def bracket_bound(self) -> None:
        """``[]`` or ``[n]``: PostgreSQL ignores array bounds in type names, and so do we."""
        self.advance()
        if self.token.kind is TokenKind.NUMBER and self.token.text.isdigit():
            self.advance()
        self.expect_punct("]", "']' in the array type")
