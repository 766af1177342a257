-- Reserved for issue 24 (signals by key before the wait, the expiry sweep, the rest); filled by its stream.
-- compatible-with-code-of-schema: 5
SELECT 1;
