-- Reserved for issue 24 (the claim returns what woke a job and its batch); filled by its stream.
-- compatible-with-code-of-schema: 5
SELECT 1;
