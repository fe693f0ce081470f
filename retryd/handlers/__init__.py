"""Business handlers: a Python callable or an HTTP endpoint, always called with a timeout."""
