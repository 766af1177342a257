-- Reserved for issue 24 (dependencies); filled by its stream.
-- compatible-with-code-of-schema: 5
SELECT 1;
