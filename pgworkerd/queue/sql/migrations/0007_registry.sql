-- 0007: the registry's live daemons served by an index.
-- compatible-with-code-of-schema: 5
--
-- An expand migration (README "Upgrading"): an index only. Every daemon marks stale
-- peers (worker_mark_stale), and drain, resume and status read the live daemons: all ask
-- for state <> 'gone', which was a sequential scan over a registry that grows by a row
-- per daemon start (measured: 11 ms at 100,000 gone rows). Gone rows are pruned by
-- `pgworkerd prune` (worker_prune_gone).
CREATE INDEX workers_live_idx ON @schema@.workers (heartbeat_at) WHERE state <> 'gone';
