-- Reserved for issue 24 (follow_ups); filled by its stream.
-- compatible-with-code-of-schema: 5
SELECT 1;
