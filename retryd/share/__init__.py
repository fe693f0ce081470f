"""Share mode (``consumer_mode = share``): the main topics read by a Kafka share group
(KIP-932), records acknowledged one by one, failures moved through retryd's tiers.

- ``group``: the share group's configuration (record lock, delivery limit), checked at start
  and read again while running;
- ``calls``: handler calls at most ``max_in_flight`` at a time, each with an attempt number
  and a deadline (async ones too: a frozen event loop is abandoned and replaced);
- ``worker``: the poll/acknowledge loop and each outcome; ``routes``: copies to the tiers
  and ``failed_topic``; ``report``: metrics and the heartbeat;
- ``fetch``: ``poll`` and ``commit_async`` guarded, and when a poll's records may have been
  acquired (their locks' start); ``delay``: ``delay=`` before the first attempt;
- ``gate``: the outage circuit breaker's share side (group mode's ``Breaker`` decides);
- ``build``: the parts composed; ``run``: the process (with role all's tiers worker).
"""
