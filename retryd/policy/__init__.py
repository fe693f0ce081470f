"""Pure retry policy: no I/O, unit-testable without a broker."""
