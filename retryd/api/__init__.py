"""The sidecar's HTTP API: health, metrics, and failed-message browsing and replay."""
