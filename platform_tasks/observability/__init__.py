"""Observability: alerts, Prometheus metrics (the platform's own and celery-exporter's
names), task events, the correlation id, trace context carried across the queue, and the
age of the oldest waiting job per queue."""
