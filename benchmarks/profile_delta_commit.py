"""What a keyed Delta append costs over a plain one, on a tiny batch (the fixed cost every batch pays).

Usage::

    python benchmarks/profile_delta_commit.py [--log-one] [--hadoop-local-fs]

Appends 100 rows 25 times with ``txnAppId``/``txnVersion`` (how streamproof keys the first batch of a run), 15 times
through Delta's transaction API with the same SetTransaction (how streamproof keys the later ones:
``streamproof.sinks.delta.commit_keyed``), and 15 times without a key, in one warm session, and prints
the seconds of each and their medians. With ``--log-one`` the 23rd keyed append
runs with Spark's INFO log on: it shows ``DELTA: Compute snapshot for version: N``, the full state
reconstruction Delta runs to read the table's transaction ids before each keyed write. With ``--hadoop-local-fs`` the
session keeps Hadoop's own local file system (a ``chmod`` process for every file created, two ``readlink`` for every
rename of Delta's log store) instead of streamproof's (``dev.streamproof.fs.ForklessLocalFileSystem``).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time

from streamproof.config import SparkSettings
from streamproof.jvm.session import build_session
from streamproof.sinks.base import Batch
from streamproof.sinks.delta import commit_keyed, start_transaction

HADOOP_LOCAL_FS = {
    "spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.LocalFileSystem",
    "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.LocalFs",
}


def main() -> None:
    spark = build_session(SparkSettings(conf=HADOOP_LOCAL_FS if "--hadoop-local-fs" in sys.argv else {}))
    path = tempfile.mkdtemp(prefix="streamproof-delta-commit-")
    shutil.rmtree(path)
    rows = spark.range(100).selectExpr("cast(id as string) as event_id", "id * 1.5 as amount")
    rows.write.format("delta").save(path)
    keyed = []
    for version in range(25):
        log_this = "--log-one" in sys.argv and version == 22
        if log_this:
            spark.sparkContext.setLogLevel("INFO")
        started = time.monotonic()
        rows.write.format("delta").mode("append").option("txnAppId", "profile").option("txnVersion", version).save(path)
        keyed.append(round(time.monotonic() - started, 3))
        if log_this:
            spark.sparkContext.setLogLevel("WARN")
    known_new = []
    for version in range(25, 40):
        started = time.monotonic()
        commit_keyed(start_transaction(spark, path), rows, Batch("profile", version, {}, keyed=True, rows=100))
        known_new.append(round(time.monotonic() - started, 3))
    plain = []
    for _ in range(15):
        started = time.monotonic()
        rows.write.format("delta").mode("append").save(path)
        plain.append(round(time.monotonic() - started, 3))
    for name, seconds in (("keyed append (writer)", keyed), ("keyed append (transaction API)", known_new),
                          ("plain append", plain)):  # fmt: skip
        print(f"{name}, median {sorted(seconds)[len(seconds) // 2]} s:", seconds)
    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
