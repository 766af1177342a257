-- Reserved for issue 24 (durable_waits); filled by its stream.
-- compatible-with-code-of-schema: 5
SELECT 1;
