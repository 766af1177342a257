-- Reserved for issue 27 (operations console); filled by its stream.
-- compatible-with-code-of-schema: 5
SELECT 1;
