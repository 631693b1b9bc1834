-- 0015: a batch of one-transaction ticks in one transaction (issue #14; engine/batches.py).
--
-- Under a backlog the daemon runs up to eight ticks of one principal, one owner and one procedure in one
-- transaction: `BEGIN; SELECT … FROM radix.run_tick(…); …; COMMIT;` and the connection's clean. Each tick
-- runs in run_tick's own subtransaction (its exception block): begin_tick, the CALL and end_tick commit
-- with the batch or, when any of them fails, roll back alone, and the row run_tick returns says which
-- step failed and how. A tick's procedure and its completion marker still commit together or not at all.

-- run_tick: one tick of a batch, as the tick query runs it (radix.begin_tick, the CALL in its DO block,
-- radix.end_tick), inside an exception block. Returns `failed_at` NULL when the tick is done (its marker
-- written in this transaction), or the step that failed ('begin': nothing ran, e.g. RXT01 when the tick is
-- not this session's; 'call': the procedure failed; 'end': the marker could not be written) with the
-- error's SQLSTATE and message. What failed is rolled back with the subtransaction; the step is kept in a
-- PL/pgSQL variable, which a rollback does not reset and procedure code cannot reach. query_canceled (a
-- statement timeout, a cancel) is not caught: it aborts the whole batch, as it aborts a lone tick.
--
-- SECURITY INVOKER and without SET clauses: the CALL runs as the principal, with the principal's own
-- settings, exactly as the lone tick's DO block does. So the principal's search_path is in force here:
-- every name below is qualified and every value typed. A role switched inside an earlier tick of the
-- batch (SET LOCAL ROLE) is not run: RXT02 at 'begin', and the daemon runs the tick alone after the batch,
-- on a connection whose clean checked its identity.
CREATE FUNCTION radix.run_tick(job uuid, planned_ns bigint, mac text, call text, next_planned_ns bigint,
                               node text, OUT failed_at text, OUT error_sqlstate text, OUT error_message text)
LANGUAGE plpgsql VOLATILE
AS $$
DECLARE
    step text := 'begin';
BEGIN
    IF CURRENT_USER OPERATOR(pg_catalog.<>) SESSION_USER THEN
        RAISE EXCEPTION 'the tick is not run here: the session''s role changed' USING ERRCODE = 'RXT02';
    END IF;
    PERFORM radix.begin_tick(job, planned_ns, mac);
    step := 'call';
    EXECUTE call;
    step := 'end';
    PERFORM radix.end_tick(job, mac, next_planned_ns, node);
EXCEPTION WHEN OTHERS THEN
    failed_at := step;
    GET STACKED DIAGNOSTICS error_sqlstate = RETURNED_SQLSTATE, error_message = MESSAGE_TEXT;
END $$;

GRANT EXECUTE ON FUNCTION radix.run_tick(uuid, bigint, text, text, bigint, text) TO PUBLIC;
