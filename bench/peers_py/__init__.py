"""The Python peers of ``bench/bench_peers.py`` (quix-streams, FastStream) and the handlers
retryd runs in the peer shapes. Each peer runs in its own virtual environment (``envs``), in
a child process of its own (``child``), so that its CPU is its process's alone and its
dependencies (quix-streams pins confluent-kafka and pydantic below retryd's) never touch
retryd's environment.
"""
