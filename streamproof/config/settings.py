"""``[trigger]``, ``[retry]``, ``[metrics]``, ``[spark]``: how and where a pipeline runs.

Example::

    >>> RetrySettings().max_outage_s, SparkSettings().master
    (120.0, 'local[2]')
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from streamproof.config.fields import Strict, duration, duration_seconds


class Trigger(Strict):
    """``[trigger]``: a batch every ``processing_time``, or ``available_now``: drain what is there, then stop."""

    processing_time: str | None = "2 seconds"
    available_now: bool = False

    @field_validator("processing_time")
    @classmethod
    def _processing_time(cls, value: str | None) -> str | None:
        return None if value is None else duration(value)


class RetrySettings(Strict):
    """``[retry]``: how long a Kafka broker or a database may be away before the pipeline gives up.

    Within ``max_outage`` a failed sink write is retried where the guarantee makes that safe (exactly-once: keyed on
    the batch; :meth:`streamproof.guarantees.Wiring.retries_a_failed_write`) and a query stopped by an unreachable
    source is restarted from its checkpoint; past it the pipeline stops with one line saying what was unreachable,
    and the next start resumes from the checkpoint.
    """

    max_outage: str = "2 minutes"
    backoff: str = "2 seconds"

    @field_validator("max_outage", "backoff")
    @classmethod
    def _durations(cls, value: str) -> str:
        return duration(value)

    @property
    def max_outage_s(self) -> float:
        return duration_seconds(self.max_outage)

    @property
    def backoff_s(self) -> float:
        return duration_seconds(self.backoff)


class MetricsSettings(Strict):
    """``[metrics]``: a Prometheus endpoint while the pipeline runs (off without a port)."""

    port: int | None = Field(None, gt=0, lt=65536)
    host: str = "127.0.0.1"


class SparkSettings(Strict):
    """``[spark]``: where the pipeline runs. Defaults fit a 2-core laptop; ``master = "spark://host:7077"`` (or
    ``yarn``, ``k8s://...``) runs it on a cluster, unchanged otherwise."""

    master: str = "local[2]"
    driver_memory: str = "2g"
    shuffle_partitions: int = Field(2, gt=0)
    # "quick-start" compiles with C1 only: a JVM that lives seconds to minutes (a crash harness restarting
    # it, a test) spends far less CPU compiling; a long-running pipeline reaches more rows/s with "tiered".
    # The environment variable STREAMPROOF_JIT overrides it (the harness and the test suite set it).
    jit: Literal["tiered", "quick-start"] = "tiered"
    # The driver JVM's garbage collector. A micro-batch allocates a burst of short-lived objects (fetched
    # records, parsed rows, the cached batch) and then drops them all: the throughput collector suits that
    # better than G1, the JVM's default. `streamproof bench tuning` drained 2M events 12% faster with it
    # (two rounds each; 8% in an earlier comparison) at a 28% lower peak memory (docs/performance.md).
    gc: Literal["parallel", "g1"] = "parallel"
    # Spark's web UI of a `streamproof run` (the next free port above it when taken); the tests and the crash
    # harness turn it off ($STREAMPROOF_SPARK_UI=off): their runs live seconds and would race for the port.
    ui: bool = True
    ui_port: int = Field(4040, ge=1, le=65535)
    conf: dict[str, str] = Field(default_factory=dict)

    @field_validator("master")
    @classmethod
    def _master(cls, value: str) -> str:
        if not re.fullmatch(
            r"local(\[(\d+|\*)(,\d+)?\])?|spark://[^\s/]+(:\d+)?(,[^\s/]+(:\d+)?)*|yarn|k8s://\S+", value
        ):
            raise ValueError(f"{value!r} is not a Spark master: local[2], spark://host:7077, yarn or k8s://https://...")
        return value

    @property
    def on_this_machine(self) -> bool:
        """In one local JVM, or on a standalone master of this machine's loopback (``infra up --spark-workers``).

        >>> SparkSettings(master="spark://127.0.0.1:7077").on_this_machine, SparkSettings(master="yarn").on_this_machine
        (True, False)
        """
        return self.master.startswith(("local", "spark://127.0.0.1", "spark://localhost"))
