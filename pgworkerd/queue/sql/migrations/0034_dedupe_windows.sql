-- Reserved for issue 25 (dedupe windows and policies); filled by its stream.
-- compatible-with-code-of-schema: 5
SELECT 1;
