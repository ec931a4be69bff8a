"""Observability: alerts, Prometheus metrics, task events and the correlation id."""
