"""Benchmarks, each a ratio against a baseline measured in the same run (``streamproof bench``).

:mod:`~streamproof.bench.common` holds what they share (pipeline children, the figures of a run);
one room per benchmark (throughput, latency, recovery, sinks, scaling, tuning);
:mod:`~streamproof.bench.runner` runs them and writes ``benchmarks/results/``.
"""
