-- Reserved for issue 27 (OpenTelemetry trace context); filled by its stream.
-- compatible-with-code-of-schema: 5
SELECT 1;
