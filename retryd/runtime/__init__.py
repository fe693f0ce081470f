"""Process runtime: state directory layout, heartbeats, signals."""
