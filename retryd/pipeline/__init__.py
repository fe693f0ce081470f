"""The Spark pipeline: a Kafka data source for PySpark and the report, archive and replay jobs.

Importing this package does not import PySpark: the pure parts (offset planning, column
building, rate limiting) work without it, and the jobs import it when they run.
"""
