"""Your job as you run it: a PySpark job file a team already ships, run unchanged under streamproof, crashed at every
moment of its batches, and reconciled against a crash-free twin of itself.

``streamproof run|prove|verify JOB.py`` (:mod:`streamproof.cli.pipeline`). The rooms, in the order a proof uses them:
``maps`` (where production addresses go), ``scan`` (the job's text read before it runs: what is refused), ``patches``
and ``inside`` (PySpark steered without editing the job), ``plan`` (the columns that differ from run to run),
``moments`` and ``yours`` (the crash points of Spark's own sinks and of your own write), ``child`` (one run),
``record`` (what a run did).
"""
