"""The slow tier (tests/conftest.py SLOW_TIER) names real tests: each test it leaves out of CI, and each CI test it
says proves the same thing. A renamed test would otherwise slip back into CI unnoticed, or leave its guarantee to a
twin that no longer exists."""

from __future__ import annotations

import re

from conftest import REPO, SLOW_TIER

NODE = re.compile(r"((?:examples/your_code/)?tests/test_\w+\.py)(?:::(\w+))?")


def _defined(path: str, name: str | None) -> bool:
    text = (REPO / path).read_text()
    return name is None or re.search(rf"^def {name}\(", text, re.MULTILINE) is not None


def test_every_slow_test_and_every_twin_it_names_exists() -> None:
    for slow, twins in SLOW_TIER.items():
        path, name = NODE.match(slow).groups()  # type: ignore[union-attr]
        assert _defined(path, name), f"SLOW_TIER names {slow}: no such test"
        named = NODE.findall(twins)
        assert named, f"{slow}: its twin names no test file"
        for twin_path, twin_name in named:
            assert _defined(twin_path, twin_name or None), f"{slow}: its twin {twin_path}::{twin_name} does not exist"
