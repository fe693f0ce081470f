"""Failed-topic browsing and replay, shared by the HTTP API, ``retryd replay`` and the pipeline.

- ``records``: how a failed record is filtered and shown (text or base64, size-limited).
- ``scan``: read a topic's partitions from given offsets to their current end, without a group.
- ``ledger``: the compacted Kafka topic that remembers which failed records were replayed.
- ``replayer``: replay one record (allow-list, ledger check, produce, ledger write).
- ``jobs``: rate-limited bulk replay jobs with progress and cancel.
"""
