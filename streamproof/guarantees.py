"""What each delivery guarantee means in streamproof, and the setups refused because they cannot honour it.

A guarantee changes how a pipeline is *wired*, never what it computes:

* ``exactly-once``: replayable source + Spark checkpoint + idempotent or transactional sink, keyed on
  (pipeline, batch id): Delta's SetTransaction, a PostgreSQL ledger row in the same transaction as the
  rows, a Kafka commit marker in the same producer transaction as the records, Spark's file-sink log.
  A batch Spark replays after a crash writes nothing the second time.
* ``at-least-once``: replayable source + checkpoint + a *plain* write (no batch key: Delta append without
  transaction id, PostgreSQL insert without ledger check, Spark's own Kafka writer, a plain Parquet
  append). A batch that reached the sink but not Spark's commit log is written again on restart:
  duplicates, never loss. (An upsert on a business key absorbs the replay by itself; an accumulating
  upsert such as ``total = total + EXCLUDED.total`` counts it twice.)
* ``at-most-once``: the batch's end offsets are recorded as done in a progress file *before* the write,
  and every start begins from that file with a fresh checkpoint. A crash between the two loses the
  batch; nothing is ever written twice.

Every question "may this guarantee lose or duplicate?" is answered here (:class:`Wiring`), nowhere else.

Example::

    >>> wiring = wiring_for("at-least-once")
    >>> wiring.may_lose, wiring.may_duplicate, wiring.idempotent_sink
    (False, True, False)
    >>> wiring_for("at-least-once").allows(lost=0, duplicated=12, unexpected=0)
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from streamproof.errors import ConfigError

Guarantee = Literal["exactly-once", "at-least-once", "at-most-once"]

REPLAYABLE_SOURCES = ("kafka", "files", "delta")
NON_REPLAYABLE_SOURCES = ("socket", "rate")
IDEMPOTENT_SINKS = ("delta", "postgres", "kafka", "files")
NON_IDEMPOTENT_SINKS = ("console", "memory")
# Kinds a pipeline file may name; the others are refused with a reason rather than "unknown kind".
KNOWN_SOURCES = REPLAYABLE_SOURCES + NON_REPLAYABLE_SOURCES
KNOWN_SINKS = IDEMPOTENT_SINKS + NON_IDEMPOTENT_SINKS


@dataclass(frozen=True)
class Wiring:
    """How a pipeline is put together for one guarantee, and what damage a crash may then leave."""

    guarantee: str
    # Batch writes keyed on (pipeline, batch id), so a replay writes nothing; the batch must then be
    # replay-deterministic (a replay must compute the rows the keyed write skips).
    idempotent_sink: bool
    # At-most-once: the batch's offsets are marked done in streamproof's progress file before the sink write, and
    # every start begins from that file with Spark's logs wiped (no replay, and none of Spark's state kept).
    progress_before_write: bool
    may_lose: bool
    may_duplicate: bool

    @property
    def exactly_once(self) -> bool:
        """Neither loss nor duplicates are allowed."""
        return not (self.may_lose or self.may_duplicate)

    def retries_a_failed_write(self, *, partial_writes_visible: bool) -> bool:
        """Whether a sink write that failed because its server was briefly away may be attempted again (``[retry]``):
        when the write is keyed (the retry writes only what the failed attempt did not), when duplicates are
        allowed, or when the sink shows nothing of a failed write. At-most-once on a sink that commits parts of a
        write on their own (PostgreSQL per task, Spark's Kafka writer) may not: the retry would write those parts
        twice. The batch fails instead, and the next start goes on after it (lost, which at-most-once allows).

        >>> wiring_for("at-most-once").retries_a_failed_write(partial_writes_visible=True)
        False
        >>> wiring_for("at-most-once").retries_a_failed_write(partial_writes_visible=False)
        True
        """
        return self.idempotent_sink or self.may_duplicate or not partial_writes_visible

    def allows(self, *, lost: int, duplicated: int, unexpected: int) -> bool:
        """Whether the damage found is within what the guarantee promises (unexpected rows never are).

        >>> wiring_for("at-most-once").allows(lost=3, duplicated=0, unexpected=0)
        True
        >>> wiring_for("exactly-once").allows(lost=0, duplicated=1, unexpected=0)
        False
        """
        return not unexpected and (not lost or self.may_lose) and (not duplicated or self.may_duplicate)


_WIRINGS = {
    "exactly-once": Wiring(
        "exactly-once", idempotent_sink=True, progress_before_write=False, may_lose=False, may_duplicate=False
    ),
    "at-least-once": Wiring(
        "at-least-once", idempotent_sink=False, progress_before_write=False, may_lose=False, may_duplicate=True
    ),
    "at-most-once": Wiring(
        "at-most-once", idempotent_sink=False, progress_before_write=True, may_lose=True, may_duplicate=False
    ),
}
GUARANTEES: tuple[str, ...] = tuple(_WIRINGS)


def wiring_for(guarantee: str) -> Wiring:
    """The wiring of a guarantee name (``exactly-once``, ``at-least-once``, ``at-most-once``)."""
    try:
        return _WIRINGS[guarantee]
    except KeyError:
        raise ConfigError(f"guarantee: {guarantee!r} is not one of {', '.join(_WIRINGS)}") from None


def refusal(guarantee: str, source_kind: str, sink_kind: str) -> str | None:
    """Why this combination cannot honour its guarantee (one line), or None when it can.

    >>> refusal("exactly-once", "socket", "delta")
    "source.kind: 'socket' cannot replay a batch after a crash, so exactly-once is impossible; use kafka, files, delta"
    >>> refusal("at-least-once", "kafka", "delta") is None
    True
    """
    if guarantee == "exactly-once" and source_kind in NON_REPLAYABLE_SOURCES:
        return (
            f"source.kind: {source_kind!r} cannot replay a batch after a crash, so exactly-once is impossible; "
            f"use {', '.join(REPLAYABLE_SOURCES)}"
        )
    if guarantee == "exactly-once" and sink_kind in NON_IDEMPOTENT_SINKS:
        return (
            f"sink.kind: {sink_kind!r} cannot skip a replayed batch (no transaction id), so exactly-once is "
            f"impossible; use {', '.join(IDEMPOTENT_SINKS)}, or guarantee = 'at-least-once'"
        )
    if source_kind not in REPLAYABLE_SOURCES:
        return f"source.kind: {source_kind!r} is recognised but not supported by streamproof yet; use kafka"
    if sink_kind not in IDEMPOTENT_SINKS:
        return (
            f"sink.kind: {sink_kind!r} is recognised but not supported by streamproof yet; "
            f"use one of {', '.join(IDEMPOTENT_SINKS)}"
        )
    return None


# S3 through Hadoop's S3A: the store creates a file only if absent (a conditional PUT, If-None-Match: *; Hadoop 3.4.2+,
# HADOOP-19256), and streamproof's own classes (jvm/s3) use it for Spark's checkpoint and Delta's log; the run lock and
# streamproof's own files use it too (storage.Location.create_new). Set for every pipeline with a file on s3a://,
# unless [spark.conf] says otherwise.
CONDITIONAL_WRITES = "spark.hadoop.fs.s3a.create.conditional.enabled"
S3_CONF = {
    "spark.sql.streaming.checkpointFileManagerClass": "dev.streamproof.s3.ConditionalCheckpointFileManager",
    "spark.delta.logStore.s3a.impl": "dev.streamproof.s3.ConditionalS3LogStore",
    # Hadoop 3.5's default reader ("analytics") retries a failed GET only inside the AWS SDK: 6 attempts within about a
    # second. A server restarting answers 500 for longer, and a batch's read of the checkpoint failed on it (`prove
    # --nemesis` on S3, step s3@2). The classic reader retries through S3A's own policy (fs.s3a.retry.limit, from
    # fs.s3a.retry.interval, backing off).
    "spark.hadoop.fs.s3a.input.stream.type": "classic",
}
S3_LOGSTORES = ("dev.streamproof.s3.ConditionalS3LogStore", "io.delta.storage.S3DynamoDBLogStore")
CHECKPOINT_MANAGER = "spark.sql.streaming.checkpointFileManagerClass"
# Spark's checkpoint and a files sink's _spark_metadata log are written through this class: on S3 only one that
# creates an entry only if absent keeps a second writer's entry from replacing the first's.
CONDITIONAL_MANAGERS = ("dev.streamproof.s3.ConditionalCheckpointFileManager",)
NO_CONDITIONAL_SCHEMES = ("s3", "s3n")  # S3 not through S3A: no conditional create there


def storage_refusal(
    guarantee: str, scheme: str, role: str, spark_conf: dict[str, str], *, bucket: str | None = None
) -> str | None:
    """Why a checkpoint (``role = "checkpoint"``) or a Delta table (``"delta"``) on storage of ``scheme`` cannot
    honour the guarantee (one line), or None when it can.

    Exactly-once needs one writer at a time and atomic commits. HDFS (atomic rename), local disks, ``abfss://``
    and ``gs://`` (Delta's own LogStores for them) give both. S3 through S3A gives both with conditional writes (the
    store refuses a second create of one key: :data:`S3_CONF`), or Delta's DynamoDB LogStore for the tables; a store
    whose conditional writes are turned off, or Delta's single-driver S3 LogStore, lets a second writer by mistake
    replace what the first wrote.

    >>> storage_refusal("exactly-once", "hdfs", "delta", {}) is None
    True
    >>> storage_refusal("exactly-once", "s3a", "delta", S3_CONF) is None
    True
    >>> storage_refusal("exactly-once", "s3a", "checkpoint", {**S3_CONF, CONDITIONAL_WRITES: "false"})[:60]
    'a checkpoint on s3a:// cannot guarantee exactly-once with sp'

    The back doors are closed too: a rename-based checkpoint manager, a bucket's own setting (``bucket``), and (at
    run start, :func:`hadoop_refusal`) Hadoop's own configuration files.

    >>> renames = "org.apache.spark.sql.execution.streaming.FileSystemBasedCheckpointFileManager"
    >>> manager = {**S3_CONF, CHECKPOINT_MANAGER: renames}
    >>> storage_refusal("exactly-once", "s3a", "files", manager)[:75]
    'a files sink on s3a:// cannot guarantee exactly-once with spark.sql.streami'
    >>> per_bucket = {**S3_CONF, "spark.hadoop.fs.s3a.bucket.prod.create.conditional.enabled": "false"}
    >>> storage_refusal("exactly-once", "s3a", "delta", per_bucket, bucket="prod").split(" = ")[0][-63:]
    'with spark.hadoop.fs.s3a.bucket.prod.create.conditional.enabled'

    A bucket's own setting decides for it over the general one, as S3A reads them:

    >>> on_for_prod = {**per_bucket, CONDITIONAL_WRITES: "false",
    ...                "spark.hadoop.fs.s3a.bucket.prod.create.conditional.enabled": "true"}
    >>> storage_refusal("exactly-once", "s3a", "delta", on_for_prod, bucket="prod") is None
    True
    """
    if not wiring_for(guarantee).exactly_once:
        return None
    what = {"checkpoint": "a checkpoint", "files": "a files sink"}.get(role, "a Delta table")
    if scheme in NO_CONDITIONAL_SCHEMES:
        return (
            f"{what} on {scheme}:// cannot guarantee exactly-once: only Hadoop's S3A (s3a://) creates a file "
            "only if absent on S3 (conditional writes); write the path as s3a://"
        )
    if scheme != "s3a":
        return None
    per_bucket = f"spark.hadoop.fs.s3a.bucket.{bucket}.create.conditional.enabled" if bucket else None
    for key in (per_bucket, CONDITIONAL_WRITES):  # S3A reads a bucket's own setting before the general one
        if key is None or key not in spark_conf:
            continue  # not set: the next, more general key decides (as hadoop_refusal reads Hadoop's own)
        if spark_conf[key].strip().lower() != "false":
            break  # set, and not off: this key decides for the bucket
        return (
            f'{what} on s3a:// cannot guarantee exactly-once with {key} = "false": a second writer by mistake '
            "(a run, a commit of one Delta version) would replace the first's file; remove the setting (S3 and "
            "the stores streamproof proves on create only-if-absent: docs/storage.md)"
        )
    manager = spark_conf.get(CHECKPOINT_MANAGER, CONDITIONAL_MANAGERS[0])
    if role in ("checkpoint", "files") and manager not in CONDITIONAL_MANAGERS:
        return (
            f'{what} on s3a:// cannot guarantee exactly-once with {CHECKPOINT_MANAGER} = "{manager}": its entries '
            "are written without a conditional create, and a second writer's would replace the first's; leave the "
            f"setting unset (streamproof sets {CONDITIONAL_MANAGERS[0]})"
        )
    store = spark_conf.get("spark.delta.logStore.s3a.impl")
    if role == "delta" and store not in S3_LOGSTORES:
        return (
            f"a Delta table on s3a:// cannot guarantee exactly-once with the LogStore {store} (one writer only); "
            f'leave [spark.conf] "spark.delta.logStore.s3a.impl" unset (streamproof\'s conditional-write LogStore) '
            f'or set it to "{S3_LOGSTORES[1]}" with its DynamoDB table (docs/storage.md)'
        )
    return None


# Where S3A reads whether to create only if absent: a bucket's own key first, then the general one.
HADOOP_CONDITIONAL_KEYS = ("fs.s3a.bucket.{bucket}.create.conditional.enabled", "fs.s3a.create.conditional.enabled")


def hadoop_refusal(guarantee: str, buckets: list[str], hadoop_get: Callable[[str], str | None],
                   sources_of: Callable[[str], str] = lambda key: "") -> str | None:  # fmt: skip
    """Why S3 cannot honour the guarantee under the Hadoop configuration the run's JVM loaded (``core-site.xml`` on
    ``HADOOP_CONF_DIR``, a bucket's own setting, ``spark.hadoop.*``), which :func:`storage_refusal` cannot see before
    Spark starts; None when every bucket of ``buckets`` creates only if absent. ``hadoop_get`` reads a key of that
    configuration, ``sources_of`` says where it was set.

    >>> conf = {"fs.s3a.bucket.prod.create.conditional.enabled": "false"}
    >>> hadoop_refusal("exactly-once", ["prod"], conf.get, lambda key: "core-site.xml")[:95]
    'the bucket prod on s3a:// cannot guarantee exactly-once: fs.s3a.bucket.prod.create.conditional.'
    >>> hadoop_refusal("exactly-once", ["prod"], {}.get) is None
    True
    """
    if not wiring_for(guarantee).exactly_once:
        return None
    for bucket in buckets:
        for template in HADOOP_CONDITIONAL_KEYS:
            key = template.format(bucket=bucket)
            value = hadoop_get(key)
            if value is None:
                continue  # not set here: the next, more general key decides
            if value.strip().lower() != "false":
                break
            where = sources_of(key)
            return (
                f'the bucket {bucket} on s3a:// cannot guarantee exactly-once: {key} = "false"'
                + (f" (set in {where})" if where else "")
                + ": a second writer by mistake would replace the first's file; remove the setting (docs/storage.md)"
            )
    return None
