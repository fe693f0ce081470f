"""The chaos suite: fault injection with a ledger check (README, "Reliability")."""
