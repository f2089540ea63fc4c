"""streamproof: Kafka -> Spark Structured Streaming pipelines with end-to-end exactly-once delivery,
and the proof (crash every phase of a micro-batch, restart, reconcile source against sink)."""

__version__ = "0.1.0"
