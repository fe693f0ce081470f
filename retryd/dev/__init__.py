"""``retryd dev``: a local run on an embedded broker with demo traffic."""
