"""definitions.build_call renders the DO block with string operations (engine/definitions.py): its identifiers
must be what psycopg's sql.Identifier renders, whatever the name, and no argument value is in its text (each is
read from the stored arguments on the server). build_tick_call renders the same CALL reading them from $1."""

from __future__ import annotations

import pytest
from psycopg import sql

from radixjobs.engine import definitions
from radixjobs.engine.definitions import build_call, build_tick_call

NAMES = ["plain", "Mixed Case", 'quo"te', '""', "ünïcödé", "semi;colon", "$dollar$", "back\\slash", "select"]


@pytest.mark.parametrize("name", NAMES)
def test_an_identifier_is_quoted_as_psycopg_quotes_it(name: str) -> None:
    assert definitions._identifier(name) == sql.Identifier(name).as_string(None)


ARGUMENTS = [{"position": 1, "type": "text", "value": "it's $radix_value_x$ ;", "name": "b"},
             {"position": 0, "type": "integer", "value": None, "name": 'a"b', "by_name": True},
             {"position": 0, "type": "numeric(10,2)", "value": "31415926", "name": "c"}]


def test_the_block_quotes_every_name_and_reads_each_value_from_the_stored_arguments() -> None:
    call = build_call('s"x', "p q", ARGUMENTS, "stored()").decode()
    assert call.startswith("DO $radix_do_")
    assert 'CALL "s""x"."p q"("radix_argument_1", "radix_argument_2", "a""b" => "radix_argument_3");' in call
    # positional first, as given; each value by its index in the stored array
    assert ('"radix_argument_1" numeric(10,2) := CAST(pg_catalog.jsonb_extract_path_text((stored()), '
            "'2', 'value') AS numeric(10,2));") in call
    assert ('"radix_argument_3" integer := CAST(pg_catalog.jsonb_extract_path_text((stored()), '
            "'1', 'value') AS integer);") in call


def test_no_value_is_in_the_text() -> None:
    for call in (build_call("s", "p", ARGUMENTS, definitions.ARGUMENTS),
                 build_tick_call("s", "p", ARGUMENTS)):
        assert b"radix_value" not in call
        assert b"31415926" not in call
        assert b"it's" not in call


def test_without_arguments_the_block_reads_nothing() -> None:
    call = build_call("s", "p", [], definitions.ARGUMENTS).decode()
    assert "radix.arguments" not in call
    assert 'CALL "s"."p"();' in call


def test_the_tick_call_is_the_blocks_call_reading_the_parameter() -> None:
    call = build_tick_call('s"x', "p q", ARGUMENTS).decode()
    assert call == ('CALL "s""x"."p q"('
                    "CAST(pg_catalog.jsonb_extract_path_text($1, '2', 'value') AS numeric(10,2)), "
                    "CAST(pg_catalog.jsonb_extract_path_text($1, '0', 'value') AS text), "
                    '"a""b" => CAST(pg_catalog.jsonb_extract_path_text($1, \'1\', \'value\') AS integer))')
