-- Two states a job waits in without being claimable (issue 24): 'waiting' for parents that
-- have not finished, 'suspended' for a signal or its timeout.
-- compatible-with-code-of-schema: 5
-- own-transaction: yes
--
-- An expand migration (docs/operations/upgrading.md): older code never writes these
-- states and claims only 'pending' jobs. PostgreSQL refuses to use an enum value in the
-- transaction that added it, so this migration commits alone (migrate.py) before the
-- migrations that write CHECKs, indexes and functions naming the new states.
ALTER TYPE @schema@.job_status ADD VALUE 'waiting' AFTER 'pending';
ALTER TYPE @schema@.job_status ADD VALUE 'suspended' AFTER 'waiting';
