"""Copies of a checkpoint are byte for byte: a state store's files are binary (LZ4 .delta/.snapshot, RocksDB), which a
copy through text corrupts. No JVM: a local checkpoint backed up to an ``hdfs://`` URI whose FileSystem is stood in
for (what Hadoop would be handed is recorded); HDFS to HDFS is test_cluster.py's."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from streamproof.checkpoint.copies import backup
from streamproof.checkpoint.folder import RunLock
from streamproof.storage.location import Location

STATE_FILE = bytes(range(256))  # every byte value: 0x80-0xFF are no UTF-8 text


class _Stream:
    def __init__(self, files: dict[str, bytes], path: str) -> None:
        self.files, self.path = files, path

    def write(self, data: bytearray) -> None:
        self.files[self.path] = self.files.get(self.path, b"") + bytes(data)

    def close(self) -> None:
        pass


class _FileSystem:
    """Hadoop's FileSystem as Location's remote writes use it: mkdirs, exists, create."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.folders: set[str] = set()

    def exists(self, path: str) -> bool:
        return path in self.files or path in self.folders

    def mkdirs(self, path: str) -> bool:
        self.folders.add(path)
        return True

    def create(self, path: str, overwrite: bool) -> _Stream:
        self.files.pop(path, None)
        return _Stream(self.files, path)


def test_a_local_checkpoint_backed_up_to_a_uri_keeps_every_byte(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = _FileSystem()
    monkeypatch.setattr(Location, "_fs", property(lambda self: fs))
    monkeypatch.setattr(Location, "_jpath", property(lambda self: self.text))
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "state" / "0" / "0").mkdir(parents=True)
    (checkpoint / "state" / "0" / "0" / "1.delta").write_bytes(STATE_FILE)
    (checkpoint / "offsets").mkdir()
    (checkpoint / "offsets" / "0").write_text('v1\n{"batchWatermarkMs":0}\n{"orders":{"0":10}}')
    done = subprocess.Popen(["true"])
    done.wait()
    (checkpoint / RunLock.NAME).write_text(str(done.pid))  # a stale lock, which a backup leaves out
    target = "hdfs://namenode:9000/backups/orders"
    assert backup(Location(checkpoint), Location(target)) == Location(target)
    expected: dict[str, Any] = {
        f"{target}/state/0/0/1.delta": STATE_FILE,
        f"{target}/offsets/0": (checkpoint / "offsets" / "0").read_bytes(),
    }
    assert fs.files == expected
