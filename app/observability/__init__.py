"""What the service reports: the access log, Prometheus metrics, request spans; below every layer that counts."""
