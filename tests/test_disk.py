"""The suite refuses to start on a disk nearly full, in one line, rather than fail in servers that do not name it."""

from __future__ import annotations

from pathlib import Path

from conftest import free_disk_refusal


def test_a_disk_with_too_little_free_is_named_in_one_line_and_one_with_enough_passes(tmp_path: Path) -> None:
    assert free_disk_refusal(tmp_path, needed=0) is None
    why = free_disk_refusal(tmp_path, needed=2**62)
    assert why is not None and why.startswith("only ") and f"on the disk of {tmp_path}" in why and "\n" not in why
