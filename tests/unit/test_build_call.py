"""definitions.build_call renders the DO block with string operations (engine/definitions.py): its identifiers
must be what psycopg's sql.Identifier renders, whatever the name, and its values one dollar-quoted constant.
build_batch_call renders the same CALL with the same CASTs in place of the block's variables."""

from __future__ import annotations

import pytest
from psycopg import sql

from radixjobs.engine import definitions
from radixjobs.engine.definitions import build_batch_call, build_call

NAMES = ["plain", "Mixed Case", 'quo"te', '""', "ünïcödé", "semi;colon", "$dollar$", "back\\slash", "select"]


@pytest.mark.parametrize("name", NAMES)
def test_an_identifier_is_quoted_as_psycopg_quotes_it(name: str) -> None:
    assert definitions._identifier(name) == sql.Identifier(name).as_string(None)


def test_the_block_quotes_every_name_and_keeps_each_value_whole() -> None:
    arguments = [{"position": 1, "type": "text", "value": "it's $radix_value_x$ ;", "name": "b"},
                 {"position": 0, "type": "integer", "value": None, "name": 'a"b', "by_name": True},
                 {"position": 0, "type": "integer", "value": "7", "name": "c"}]
    call = build_call('s"x', "p q", arguments).decode()
    assert call.startswith("DO $radix_do_")
    assert 'CALL "s""x"."p q"("radix_argument_1", "radix_argument_2", "a""b" => "radix_argument_3");' in call
    assert '"radix_argument_3" integer := CAST(NULL AS integer);' in call
    assert "it's $radix_value_x$ ;" in call


def test_the_batch_call_is_the_blocks_call_with_its_casts_in_place_of_its_variables() -> None:
    arguments = [{"position": 1, "type": "text", "value": "it's $radix_value_x$ ;", "name": "b"},
                 {"position": 0, "type": "integer", "value": None, "name": 'a"b', "by_name": True},
                 {"position": 0, "type": "numeric(10,2)", "value": "7", "name": "c"}]
    call = build_batch_call('s"x', "p q", arguments).decode()
    assert call.startswith('CALL "s""x"."p q"(CAST($radix_value_')
    assert call.endswith(' AS text), "a""b" => CAST(NULL AS integer))')
    assert " AS numeric(10,2)), CAST($radix_value_" in call
    assert "it's $radix_value_x$ ;" in call
    assert "DO" not in call
