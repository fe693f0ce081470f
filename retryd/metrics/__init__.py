"""Prometheus metrics from the spec (section 4), shared by workers and the sidecar."""
