"""Share mode (``consumer_mode = share``): the main topics read by a Kafka share group
(KIP-932), records acknowledged one by one, failures moved through retryd's tiers.

- ``group``: the share group's configuration (record lock, delivery limit), checked at start;
- ``calls``: handler calls at most ``max_in_flight`` at a time;
- ``worker``: the poll/acknowledge loop and each outcome;
- ``build``: the parts composed; ``run``: the process (with role all's tiers worker).
"""
