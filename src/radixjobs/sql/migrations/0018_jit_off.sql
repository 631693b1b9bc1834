-- 0018: radix's own routines never JIT-compile their statements.
--
-- PostgreSQL decides per statement to JIT-compile it when its estimated cost passes jit_above_cost
-- (100,000 by default; inlining and optimisation past 500,000), wherever the server was built with LLVM
-- (the distributions' packages are; the embedded 18 is not). The finder's generic plan (radix.find_ticks,
-- plan_cache_mode = force_generic_plan) estimates its deal at over a million rows, so on such a server
-- each find was compiled afresh, about a second of the server's CPU for a statement that runs in well
-- under a millisecond, and every tick of the node waited behind it. Radix's statements are short and their
-- costs are estimates of generic plans: compiling them never pays.
--
-- Every radix routine that has settings of its own (a SET clause: never inlined anyway) now also sets
-- jit = off, which holds while its statements are planned and run, whatever the server's or the session's
-- setting (a principal's ALTER ROLE … SET jit_above_cost = 0 included). The routines without a SET clause
-- are left as they are: the inlinable SQL helpers (a SET clause would stop their inlining), and
-- radix.run_tick / radix.run_ticks, which run the jobs' own CALLs under the principal's own settings.
-- A routine created or replaced later carries SET jit = off in its definition;
-- tests/integration/test_migrate.py checks that every routine with settings has it.
DO $$
DECLARE
    routine regprocedure;
BEGIN
    FOR routine IN
        SELECT p.oid FROM pg_catalog.pg_proc p
        WHERE p.pronamespace OPERATOR(pg_catalog.=) 'radix'::pg_catalog.regnamespace AND p.proconfig IS NOT NULL
        ORDER BY p.oid
    LOOP
        EXECUTE pg_catalog.format('ALTER FUNCTION %s SET jit = off', routine);
    END LOOP;
END $$;
