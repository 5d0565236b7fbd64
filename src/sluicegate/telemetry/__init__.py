"""Logs and traces: the JSON log format (telemetry/logs.py) and OpenTelemetry tracing (telemetry/tracing.py).
Below every layer that uses them; they import nothing of the server."""
