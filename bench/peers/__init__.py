"""Peers of retryd's peer benchmark: other systems run on the same broker, side by side."""
