"""JVM jars: resolved once with Maven from the poms in ``jvm/``, then read from a local cache.

Three sets exist:

* ``spark``: Delta Lake, Spark's Kafka connector and Hadoop's S3A with their runtime dependencies, minus every
  artifact the pyspark wheel already ships (Spark's own jars are never duplicated, so no second
  Jackson, Hadoop or Parquet can shadow Spark's), and streamproof's own classes for S3, built from ``jvm/s3``;
* ``kafka``: the Apache Kafka broker (KRaft) with a log4j2 backend, for ``streamproof infra up``;
* ``hdfs``: the HDFS NameNode and DataNode (Hadoop at the version pyspark bundles as its client), for
  ``streamproof infra up --hdfs``; their own JVMs, never on Spark's classpath.

Invariant: a set is resolved into ``<cache>/jars/<set>-<key>/`` where ``key`` hashes the pom, the Maven
settings and (for ``spark``) the pyspark version; the folder is complete only once its ``.complete``
marker exists, so an interrupted resolution is redone, a finished one is reused without network, and
nothing is downloaded while a pipeline runs (:func:`cached_jars` never calls Maven).

Example::

    $ python -m streamproof.jvm.jars          # set-up: resolve both sets (network, once)
    >>> from streamproof.jvm.jars import cached_jars
    >>> [p.name for p in cached_jars("spark") if p.name.startswith("delta-spark")]
    ['delta-spark_4.2_2.13-4.4.0.jar']
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from streamproof.errors import SetupError

REPO_ROOT = Path(__file__).resolve().parents[2]


def maven_folder() -> Path:
    """The Maven projects (poms, settings, streamproof's own Java): ``jvm/`` of a checkout, or, installed from a
    wheel, the package's ``jvm/maven/`` (setup.py ships ``jvm/`` there)."""
    installed = Path(__file__).resolve().parent / "maven"
    return installed if (installed / "settings.xml").is_file() else REPO_ROOT / "jvm"


JVM_DIR = maven_folder()
MAVEN_SETTINGS = JVM_DIR / "settings.xml"
JAR_SETS = ("spark", "kafka", "hdfs")
OWN_CLASSES = JVM_DIR / "s3"  # streamproof's own Java (a checkpoint manager and a Delta LogStore for S3): built

# "<artifactId>-<version>.jar", where the version is the last "-<digits>." run: greedy on the artifact
# so that "spark-sql-kafka-0-10_2.13-4.2.0.jar" splits at "-4.2.0", not at "-0-10".
_JAR_NAME = re.compile(r"^(?P<artifact>.+)-(?P<version>\d+\.[^-]*(?:-[A-Za-z0-9.]+)?)\.jar$")


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


def cache_root() -> Path:
    """Folder holding resolved jar sets; ``STREAMPROOF_CACHE`` overrides ``~/.cache/streamproof``."""
    override = os.environ.get("STREAMPROOF_CACHE")
    return Path(override) if override else Path.home() / ".cache" / "streamproof"


def artifact_id(jar_file_name: str) -> str:
    """The Maven artifactId of a jar file name, version stripped.

    >>> artifact_id("spark-sql-kafka-0-10_2.13-4.2.0.jar")
    'spark-sql-kafka-0-10_2.13'
    >>> artifact_id("zstd-jni-1.5.7-3.jar")
    'zstd-jni'
    """
    match = _JAR_NAME.match(jar_file_name)
    return match.group("artifact") if match else jar_file_name.removesuffix(".jar")


def pyspark_jars_dir() -> Path:
    """The ``jars/`` folder of the installed pyspark wheel (Spark's own JVM classpath), found without importing
    pyspark (which starts nothing, but takes a while to import)."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise SetupError("pyspark is not installed: run `make setup`")
    return Path(spec.origin).resolve().parent / "jars"


@dataclass(frozen=True)
class JarSet:
    name: str
    pom: Path

    def key(self) -> str:
        digest = hashlib.sha256()
        digest.update(self.pom.read_bytes())
        digest.update(MAVEN_SETTINGS.read_bytes())
        if self.name == "spark":
            digest.update(importlib.metadata.version("pyspark").encode())
            digest.update(f"{DRIVER_CLASSPATH}/{_DRIVER_CLASSES}".encode())  # a set made before that folder is redone
            for source in sorted(OWN_CLASSES.rglob("*")):  # its own classes are rebuilt when their code changes
                if source.is_file() and "target" not in source.relative_to(OWN_CLASSES).parts:
                    digest.update(str(source.relative_to(OWN_CLASSES)).encode())
                    digest.update(source.read_bytes())
        return digest.hexdigest()[:16]

    def folder(self) -> Path:
        return cache_root() / "jars" / f"{self.name}-{self.key()}"


def jar_set(name: str) -> JarSet:
    if name not in JAR_SETS:
        raise SetupError(f"unknown jar set {name!r}: expected one of {', '.join(JAR_SETS)}")
    return JarSet(name, JVM_DIR / name / "pom.xml")


def cached_jars(name: str) -> list[Path]:
    """The jars of a resolved set, sorted; never touches the network.

    Raises :class:`SetupError` with the command to run when the set was not resolved yet.
    """
    folder = jar_set(name).folder()
    if not (folder / ".complete").exists():
        raise SetupError(
            f"the {name} JVM jars are not resolved yet (no {folder}): "
            "run `make setup` or `python -m streamproof.jvm.jars`"
        )
    return sorted(folder.glob("*.jar"))


def resolve(name: str, *, quiet: bool = True) -> list[Path]:
    """Resolve a jar set with Maven into the cache (only if missing) and return its jars."""
    target = jar_set(name)
    folder = target.folder()
    if (folder / ".complete").exists():
        return cached_jars(name)
    mvn = shutil.which("mvn")
    if mvn is None:
        raise SetupError("Maven (`mvn`) is not on PATH: install it (apt-get install -y maven) and retry")
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=f".{name}-") as tmp:
        staging = Path(tmp) / "jars"
        goals = ["dependency:copy-dependencies", "-DincludeScope=runtime", f"-DoutputDirectory={staging}"]
        _maven(mvn, target.pom, goals, quiet=quiet, failure=f"could not resolve {target.pom}")
        if name == "spark":
            _drop_jars_spark_already_ships(staging)
            _build_own_classes(mvn, staging, quiet=quiet)
        (staging / ".complete").write_text(target.key() + "\n")
        if folder.exists():  # an earlier interrupted attempt
            shutil.rmtree(folder)
        staging.rename(folder)
    return cached_jars(name)


def _build_own_classes(mvn: str, staging: Path, *, quiet: bool) -> None:
    """``mvn package`` of :data:`OWN_CLASSES` (compiled against jars already present: nothing transitive fetched),
    its jar put with the set's. Built in a copy beside the staging folder: an installed package's folder may not be
    writable, and a checkout keeps no build output."""
    sources = staging.parent / "own-classes"
    shutil.copytree(OWN_CLASSES, sources, ignore=shutil.ignore_patterns("target"))
    goals = ["package", "-DskipTests"]
    _maven(mvn, sources / "pom.xml", goals, quiet=quiet, failure=f"could not build {OWN_CLASSES}")
    for jar in (sources / "target").glob("streamproof-*.jar"):
        shutil.copy2(jar, staging / jar.name)
        _driver_classpath_jar(jar, staging / DRIVER_CLASSPATH / "streamproof-local-fs.jar")


# Beside a set's jars, what must be on the driver JVM's own classpath: the local file system Spark's settings name
# (``fs.file.impl``) is loaded by spark-submit before the jars of ``spark.jars`` are, and only those classes are there
# (the rest of streamproof's need Delta's, which ``spark.jars`` loads).
DRIVER_CLASSPATH = "driver-classpath"
_DRIVER_CLASSES = "dev/streamproof/fs/"


def _driver_classpath_jar(built: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(built) as source, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as jar:
        for entry in source.infolist():
            if entry.filename == "META-INF/MANIFEST.MF" or entry.filename.startswith(_DRIVER_CLASSES):
                jar.writestr(entry, source.read(entry))


def driver_classpath(name: str = "spark") -> list[Path]:
    """The jars a set puts on the driver JVM's own classpath (``spark.driver.extraClassPath``); never touches the
    network.

    >>> [path.name for path in driver_classpath()]                                      # doctest: +SKIP
    ['streamproof-local-fs.jar']
    """
    cached_jars(name)  # resolved, or the error that says how
    return sorted((jar_set(name).folder() / DRIVER_CLASSPATH).glob("*.jar"))


def _maven(mvn: str, pom: Path, goals: list[str], *, quiet: bool, failure: str) -> None:
    """Run Maven on ``pom`` with the project's settings; a failure is a :class:`SetupError`, "Maven ``failure``:"
    and Maven's last lines."""
    command = [mvn, "-B", *(["-q"] if quiet else []), "-s", str(MAVEN_SETTINGS), "-f", str(pom), *goals]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise SetupError(f"Maven {failure}:\n{tail}")


def _drop_jars_spark_already_ships(staging: Path) -> None:
    shipped = {artifact_id(jar.name) for jar in pyspark_jars_dir().glob("*.jar")}
    for jar in staging.glob("*.jar"):
        if artifact_id(jar.name) in shipped:
            jar.unlink()


def kafka_broker_classpath() -> str:
    """``java -cp`` value for the local Kafka broker."""
    return os.pathsep.join(str(jar) for jar in cached_jars("kafka"))


def main(argv: list[str] | None = None) -> int:
    """Set-up entry point: resolve the named sets (default: all), print where they are."""
    names = (argv if argv is not None else sys.argv[1:]) or list(JAR_SETS)
    try:
        for name in names:
            jars = resolve(name)
            print(f"{name}: {len(jars)} jars in {jar_set(name).folder()}")
    except SetupError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
