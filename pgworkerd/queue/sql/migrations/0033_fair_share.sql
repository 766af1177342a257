-- Reserved for issue 25 (fair share and start-rate limits); filled by its stream.
-- compatible-with-code-of-schema: 5
SELECT 1;
