"""What operators see and what the host asks of the process.

Why a package: observability and process hygiene, apart from the protocol: Prometheus
metrics (``metrics``, ``state_gauges``), log formats (``logs``), bounded fault lines
(``faults``), optional OpenTelemetry tracing (``tracing``), systemd notifications
(``sdnotify``), the open-file limit (``fdlimit``) and idle shutdown (``idle``).
"""
