"""How fast a client creates small files on the HDFS of ``streamproof infra up --hdfs``, with Hadoop's default close
retry delay and with a short one.

Usage::

    streamproof infra up --hdfs
    python benchmarks/profile_hdfs_small_files.py [hdfs://127.0.0.1:9000]

Writes 60 files of 400 bytes (the size of a Delta commit) three times: Hadoop's defaults (400 ms, 5 retries), then
streamproof's ``dfs.client.block.write.locateFollowingBlock.initial.delay.ms = 10`` with 10 retries (how long a client
waits before it asks the NameNode again to close a file whose block the DataNode has not reported yet, and how many
times), then the defaults again.
Each file is a create, a write and a close through one FileSystem instance. Findings: docs/performance.md.
"""

from __future__ import annotations

import sys
import time

from streamproof.jvm.session import HADOOP_CLOSE_RETRY, HDFS_CLOSE_RETRY, build_session


def main() -> None:
    uri = sys.argv[1] if len(sys.argv) > 1 else "hdfs://127.0.0.1:9000"
    spark = build_session()
    jvm = spark._jvm
    assert jvm is not None, "a classic session has a JVM"
    hadoop = jvm.org.apache.hadoop
    try:
        # Both set explicitly: streamproof's sessions default to its own (session.HDFS_CLOSE_RETRY).
        for label, settings in (("defaults (400 ms, 5 retries)", HADOOP_CLOSE_RETRY),
                                ("streamproof's (10 ms, 10 retries)", HDFS_CLOSE_RETRY),
                                ("defaults again", HADOOP_CLOSE_RETRY)):  # fmt: skip
            conf = hadoop.conf.Configuration(spark._jsc.hadoopConfiguration())
            for name, value in settings.items():
                conf.set(name.removeprefix("spark.hadoop."), value)
            fs = hadoop.fs.FileSystem.newInstance(jvm.java.net.URI(uri), conf)  # not the cached instance
            folder = f"/streamproof-small-files-{time.time_ns()}"
            started = time.monotonic()
            for index in range(60):
                out = fs.create(hadoop.fs.Path(f"{folder}/{index:020d}.json"), True)
                out.write(bytearray(b"x" * 400))
                out.close()
            seconds = time.monotonic() - started
            print(f"{label}: 60 files in {seconds:.2f} s = {60 / seconds:.1f} files/s", flush=True)
            fs.delete(hadoop.fs.Path(folder), True)
            fs.close()
    finally:
        spark.stop()


if __name__ == "__main__":
    main()
