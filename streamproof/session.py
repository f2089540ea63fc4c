"""The SparkSession a pipeline runs in: cached jars, Delta extensions, defaults sized for a laptop.

Nothing here downloads anything: the jars come from the cache that ``make setup`` filled
(:mod:`streamproof.jars`). On a cluster, ``[spark] master`` and ``[spark.conf]`` override the defaults.

Example::

    >>> from streamproof.session import build_session
    >>> spark = build_session()                       # local[2], Delta + Kafka connector loaded
    >>> spark.range(3).write.format("delta").save("/tmp/t")  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from streamproof.config import SparkSettings
from streamproof.errors import SetupError
from streamproof.jars import cached_jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOG4J_CONFIG = Path(__file__).resolve().parent / "log4j2.properties"


@functools.cache
def check_java() -> str:
    """Return the Java major version; raise :class:`SetupError` if java is missing or older than 17."""
    java = shutil.which("java", path=_java_path())
    if java is None:
        raise SetupError("`java` is not on PATH: install Java 17 (apt-get install -y openjdk-17-jdk-headless)")
    banner = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    match = re.search(r'version "(\d+)(?:\.(\d+))?', banner)
    major = int(match.group(1)) if match else 0
    if major == 1 and match and match.group(2):  # "1.8.0_..."
        major = int(match.group(2))
    if major < 17:
        raise SetupError(f"Java 17 or newer is needed, found {banner.splitlines()[0] if banner else java}")
    return str(major)


def _java_path() -> str:
    java_home = os.environ.get("JAVA_HOME")
    path = os.environ.get("PATH", "")
    return f"{java_home}/bin{os.pathsep}{path}" if java_home else path


def session_conf(settings: SparkSettings) -> dict[str, str]:
    """Spark configuration streamproof starts every session with (user ``[spark.conf]`` wins)."""
    conf = {
        "spark.master": settings.master,
        "spark.driver.memory": settings.driver_memory,
        "spark.jars": ",".join(str(jar) for jar in cached_jars("spark")),
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.shuffle.partitions": str(settings.shuffle_partitions),
        "spark.default.parallelism": str(settings.shuffle_partitions),
        # Delta reconstructs table state with 50 tasks by default: pure overhead on a laptop.
        "spark.databricks.delta.snapshotPartitions": str(settings.shuffle_partitions),
        # Event times are compared and stored in UTC whatever the machine's zone.
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J_CONFIG.as_uri()}",
        "spark.sql.streaming.metricsEnabled": "true",
        "spark.sql.debug.maxToStringFields": "200",
        # A micro-batch is cached once to feed two writes (sink and quarantine) and dropped right after:
        # compressing it costs more than it saves (measured: 25% of the batch's materialisation time).
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
    }
    conf.update(settings.conf)
    return conf


def build_session(settings: SparkSettings | None = None, app_name: str = "streamproof") -> SparkSession:
    """Start (or reuse) the process's SparkSession with streamproof's defaults."""
    check_java()
    settings = settings or SparkSettings()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    for key, value in session_conf(settings).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark
