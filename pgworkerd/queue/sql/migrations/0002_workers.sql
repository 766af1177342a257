-- 0002: the registry of daemons, for status, drain and stale-daemon detection.

CREATE TABLE @schema@.workers (
    id              text PRIMARY KEY,
    host            text NOT NULL,
    pid             integer NOT NULL,
    version         text NOT NULL,
    queues          text[] NOT NULL DEFAULT '{}',
    handlers        text[] NOT NULL DEFAULT '{}',
    slots           integer NOT NULL CHECK (slots >= 0),
    in_flight       bigint[] NOT NULL DEFAULT '{}',
    state           text NOT NULL DEFAULT 'starting'
                    CHECK (state IN ('starting', 'running', 'draining', 'drained', 'stopping',
                                     'gone')),
    -- Set by `pgworkerd drain`, cleared by `pgworkerd resume`; the daemon reads it.
    drain_requested boolean NOT NULL DEFAULT false,
    started_at      timestamptz NOT NULL DEFAULT now(),
    heartbeat_at    timestamptz NOT NULL DEFAULT now(),
    stopped_at      timestamptz
);

CREATE INDEX workers_host_idx ON @schema@.workers (host);
