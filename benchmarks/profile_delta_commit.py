"""What a keyed Delta append costs over a plain one, on a tiny batch (the fixed cost every batch pays).

Usage::

    python benchmarks/profile_delta_commit.py [--log-one]

Appends 100 rows 25 times with ``txnAppId``/``txnVersion`` (how streamproof keys a batch) and 15 times
without, in one warm session, and prints the seconds of each. With ``--log-one`` the 23rd keyed append
runs with Spark's INFO log on: it shows ``DELTA: Compute snapshot for version: N``, the full state
reconstruction Delta runs to read the table's transaction ids before each keyed write.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time

from streamproof.session import build_session


def main() -> None:
    spark = build_session()
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
    plain = []
    for _ in range(15):
        started = time.monotonic()
        rows.write.format("delta").mode("append").save(path)
        plain.append(round(time.monotonic() - started, 3))
    print("keyed append, s:", keyed)
    print("plain append, s:", plain)
    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    main()
