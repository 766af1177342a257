-- claim_jobs_v3 with a generic plan for its statements (issue 26's session): its last
-- statement reads the claimed rows through an array of ids, and left to plan_cache_mode
-- = auto PostgreSQL planned that statement anew at every call (custom plans: 0.45 ms of
-- an idle claim's 1.2 ms, pg_stat_statements' plans = calls). The generic plan is the
-- same join by primary key; its other statements had settled on generic plans already.
-- compatible-with-code-of-schema: 5
--
-- An expand migration: one setting of the function (same text, signature and result:
-- grants kept). The declaration is objects/claim.sql.

ALTER FUNCTION @schema@.claim_jobs_v3(text, text[], integer, jsonb)
    SET plan_cache_mode = force_generic_plan;
