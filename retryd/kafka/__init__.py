"""Kafka I/O: client configuration, topic provisioning, the embedded broker."""
