"""The retry engine: consume, call the handler, route failures, wait for due times."""
