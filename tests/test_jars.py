"""Jar cache: names are parsed right, and a missing cache is a clear set-up error, never a download."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamproof.errors import SetupError
from streamproof.jvm.jars import artifact_id, cached_jars, jar_set


@pytest.mark.parametrize(
    ("file_name", "artifact"),
    [
        ("spark-sql-kafka-0-10_2.13-4.2.0.jar", "spark-sql-kafka-0-10_2.13"),
        ("delta-spark_4.2_2.13-4.4.0.jar", "delta-spark_4.2_2.13"),
        ("zstd-jni-1.5.7-3.jar", "zstd-jni"),
        ("jackson-annotations-2.21.jar", "jackson-annotations"),
        ("HdrHistogram-2.2.2.jar", "HdrHistogram"),
        ("kafka_2.13-4.3.1.jar", "kafka_2.13"),
    ],
)
def test_artifact_id_strips_the_version(file_name: str, artifact: str) -> None:
    assert artifact_id(file_name) == artifact


def test_missing_cache_says_how_to_fill_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMPROOF_CACHE", str(tmp_path))
    with pytest.raises(SetupError, match=r"the spark JVM jars are not resolved yet .* run `make setup`"):
        cached_jars("spark")


def test_cache_folder_is_keyed_by_the_pom(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMPROOF_CACHE", str(tmp_path))
    folder = jar_set("kafka").folder()
    assert folder.parent == tmp_path / "jars"
    assert folder.name.startswith("kafka-") and len(folder.name) == len("kafka-") + 16


def test_spark_set_never_duplicates_a_jar_pyspark_ships() -> None:
    from streamproof.jvm.jars import pyspark_jars_dir

    shipped = {artifact_id(jar.name) for jar in pyspark_jars_dir().glob("*.jar")}
    ours = [artifact_id(jar.name) for jar in cached_jars("spark")]
    assert "delta-spark_4.2_2.13" in ours and "spark-sql-kafka-0-10_2.13" in ours
    assert not shipped & set(ours)
