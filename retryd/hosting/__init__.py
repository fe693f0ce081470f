"""Hosting of worker runs: processes, signals, the supervisor of ``--processes N``, the drain
watch, and which event sinks (Prometheus) a process wires in. Not engine: the engine in
``retryd.worker`` runs one loop and knows nothing of processes."""
