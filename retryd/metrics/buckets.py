"""Histogram bucket bounds of the spec's metrics (no Prometheus import: the worker's event
stream aggregates observations in these bounds before any metric is touched)."""

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
LATENESS_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
