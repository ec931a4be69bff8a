"""Observability: trace context carried across the queue, metrics in the names dashboards
already use, and the age of the oldest waiting job per queue."""
