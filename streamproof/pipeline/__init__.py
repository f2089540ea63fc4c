"""The pipeline at run time: source -> transform -> sinks as one streaming query.

* :mod:`~streamproof.pipeline.query`: the query, its start, stop and restarts through outages (``run``);
* :mod:`~streamproof.pipeline.standby`: ``run --standby``, a warm second process that takes over (``run_standing_by``);
* :mod:`~streamproof.pipeline.batches`: what happens in one micro-batch, phase by phase (``BatchWriter``);
* :mod:`~streamproof.pipeline.progress`: Spark's progress -> the run's events, summary and metrics;
* :mod:`~streamproof.pipeline.events`: the events a run publishes (JSON lines for programs, lines for people).
"""
