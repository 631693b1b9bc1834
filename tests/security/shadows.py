"""A hostile role's kit: a schema that shadows every pg_catalog function, operator and aggregate it can.

Each shadow has exactly the signature of the pg_catalog object it copies, so it wins wherever its schema
comes before pg_catalog in a session's search_path (``ALTER ROLE … SET search_path = evil, pg_catalog``),
and it is a strictly better match than pg_catalog's in any statement that relied on an implicit cast.
A shadow that is called counts itself (a sequence: kept even when the calling transaction rolls back;
attempted in a subtransaction so a read-only transaction does not hide the raise) and then raises
``shadow NAME called``, so the caller's statement fails as well.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

KIT = r"""
CREATE SEQUENCE {schema}.hits;
CREATE TABLE {schema}.calls (name text, at timestamptz DEFAULT pg_catalog.clock_timestamp());
GRANT USAGE ON SCHEMA {schema} TO PUBLIC;
GRANT USAGE ON SEQUENCE {schema}.hits TO PUBLIC;
GRANT INSERT ON {schema}.calls TO PUBLIC;
CREATE FUNCTION {schema}._hit(what text) RETURNS void LANGUAGE plpgsql SET search_path = pg_catalog AS $h$
BEGIN
    BEGIN
        PERFORM pg_catalog.nextval('{schema}.hits'::pg_catalog.regclass);
        INSERT INTO {schema}.calls (name) VALUES (what);
    EXCEPTION WHEN OTHERS THEN NULL;  -- read-only transaction: the raise below still tells
    END;
    RAISE EXCEPTION 'shadow % called', what;
END $h$;
DO $gen$
DECLARE
    s text := '{schema_text}';
    f record;
    body text;
BEGIN
    -- functions: every plain pg_catalog function over ordinary types (and void results)
    FOR f IN
        SELECT p.oid, p.proname, p.prorettype,
               (SELECT pg_catalog.string_agg(pg_catalog.format_type(t, NULL), ', ' ORDER BY i)
                  FROM pg_catalog.unnest(p.proargtypes::oid[]) WITH ORDINALITY AS u(t, i)) AS args
        FROM pg_catalog.pg_proc p
        WHERE p.pronamespace = 'pg_catalog'::pg_catalog.regnamespace AND p.prokind = 'f' AND NOT p.proretset
          AND p.provariadic = 0
          AND NOT EXISTS (SELECT 1 FROM pg_catalog.unnest(p.proargtypes::oid[]) AS a(t)
                          JOIN pg_catalog.pg_type y ON y.oid = a.t WHERE y.typtype = 'p')
          AND (p.prorettype = 'void'::pg_catalog.regtype
               OR (SELECT y.typtype FROM pg_catalog.pg_type y WHERE y.oid = p.prorettype) <> 'p')
    LOOP
        body := pg_catalog.format('BEGIN PERFORM %I._hit(%L); END', s, 'function ' || f.proname);
        BEGIN
            EXECUTE pg_catalog.format('CREATE FUNCTION %I.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L',
                s, f.proname, coalesce(f.args, ''), pg_catalog.format_type(f.prorettype, NULL), body);
        EXCEPTION WHEN OTHERS THEN NULL;
        END;
    END LOOP;
    -- operators: every pg_catalog operator over ordinary types
    FOR f IN
        SELECT o.oid, o.oprname, o.oprleft, o.oprright, o.oprresult FROM pg_catalog.pg_operator o
        WHERE o.oprnamespace = 'pg_catalog'::pg_catalog.regnamespace AND o.oprresult <> 0
          AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_type y
                          WHERE y.oid IN (o.oprleft, o.oprright, o.oprresult) AND y.typtype = 'p')
    LOOP
        body := pg_catalog.format('BEGIN PERFORM %I._hit(%L); END', s, 'operator ' || f.oprname);
        BEGIN
            IF f.oprleft = 0 THEN
                EXECUTE pg_catalog.format('CREATE FUNCTION %I.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L',
                    s, 'op_' || f.oid, pg_catalog.format_type(f.oprright, NULL),
                    pg_catalog.format_type(f.oprresult, NULL), body);
                EXECUTE pg_catalog.format('CREATE OPERATOR %I.%s (RIGHTARG = %s, FUNCTION = %I.%I)',
                    s, f.oprname, pg_catalog.format_type(f.oprright, NULL), s, 'op_' || f.oid);
            ELSE
                EXECUTE pg_catalog.format('CREATE FUNCTION %I.%I(%s, %s) RETURNS %s LANGUAGE plpgsql AS %L',
                    s, 'op_' || f.oid, pg_catalog.format_type(f.oprleft, NULL),
                    pg_catalog.format_type(f.oprright, NULL), pg_catalog.format_type(f.oprresult, NULL), body);
                EXECUTE pg_catalog.format(
                    'CREATE OPERATOR %I.%s (LEFTARG = %s, RIGHTARG = %s, FUNCTION = %I.%I)',
                    s, f.oprname, pg_catalog.format_type(f.oprleft, NULL),
                    pg_catalog.format_type(f.oprright, NULL), s, 'op_' || f.oid);
            END IF;
        EXCEPTION WHEN OTHERS THEN NULL;
        END;
    END LOOP;
    -- aggregates of at most one ordinary argument (min, max, count(*), sum, …): the final function
    -- raises, so even an aggregate over no rows is caught
    FOR f IN
        SELECT p.oid, p.proname, p.pronargs, p.proargtypes[0] AS arg, p.prorettype, a.aggtranstype
        FROM pg_catalog.pg_aggregate a JOIN pg_catalog.pg_proc p ON p.oid = a.aggfnoid
        WHERE p.pronamespace = 'pg_catalog'::pg_catalog.regnamespace AND a.aggkind = 'n' AND p.pronargs <= 1
          AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_type y
                          WHERE y.oid IN (a.aggtranstype, p.prorettype,
                                          CASE WHEN p.pronargs = 1 THEN p.proargtypes[0] END)
                            AND y.typtype = 'p')
    LOOP
        body := pg_catalog.format('BEGIN PERFORM %I._hit(%L); END', s, 'aggregate ' || f.proname);
        BEGIN
            EXECUTE pg_catalog.format('CREATE FUNCTION %I.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L',
                s, 'aggstep_' || f.oid,
                pg_catalog.format_type(f.aggtranstype, NULL)
                    || CASE WHEN f.pronargs = 1 THEN ', ' || pg_catalog.format_type(f.arg, NULL) ELSE '' END,
                pg_catalog.format_type(f.aggtranstype, NULL), body);
            EXECUTE pg_catalog.format('CREATE FUNCTION %I.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L',
                s, 'aggfinal_' || f.oid, pg_catalog.format_type(f.aggtranstype, NULL),
                pg_catalog.format_type(f.prorettype, NULL), body);
            EXECUTE pg_catalog.format(
                'CREATE AGGREGATE %I.%I(%s) (SFUNC = %I.%I, STYPE = %s, FINALFUNC = %I.%I)',
                s, f.proname,
                CASE WHEN f.pronargs = 1 THEN pg_catalog.format_type(f.arg, NULL) ELSE '*' END,
                s, 'aggstep_' || f.oid, pg_catalog.format_type(f.aggtranstype, NULL), s, 'aggfinal_' || f.oid);
        EXCEPTION WHEN OTHERS THEN NULL;
        END;
    END LOOP;
END $gen$;
"""


def install_shadows(conn: psycopg.Connection[Any], schema: str, owner: str) -> int:
    """Create ``schema`` owned by ``owner`` and fill it with shadows (as ``owner``); returns how many."""
    conn.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(sql.Identifier(schema), sql.Identifier(owner)))
    conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(owner)))
    try:
        text = KIT.replace("{schema_text}", schema.replace("'", "''")).replace(
            "{schema}", sql.Identifier(schema).as_string(conn))
        conn.execute(text.encode())
    finally:
        conn.execute("RESET ROLE")
    row = conn.execute("SELECT count(*) FROM pg_catalog.pg_proc WHERE pronamespace = %s::regnamespace",
                       (schema,)).fetchone()
    return int(row[0]) if row else 0


def hits(conn: psycopg.Connection[Any], schema: str) -> tuple[int, list[str]]:
    """How many times shadows of ``schema`` were called, and the names recorded (those that committed)."""
    seq = sql.SQL("SELECT last_value, is_called FROM {}.hits").format(sql.Identifier(schema))
    row = conn.execute(seq).fetchone()
    count = int(row[0]) if row and row[1] else 0
    names = conn.execute(sql.SQL("SELECT DISTINCT name FROM {}.calls ORDER BY 1").format(
        sql.Identifier(schema))).fetchall()
    return count, [n[0] for n in names]
