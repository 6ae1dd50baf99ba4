"""Docs are code: what the docs point at exists."""

from __future__ import annotations

import re

from tests.conftest import REPO


def test_every_test_the_fault_table_names_exists():
    text = (REPO / "docs" / "faults.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", text)
    assert len(named) >= 15
    missing = [
        f"{path}::{name}"
        for path, name in named
        if not re.search(rf"^def {name}\(", (REPO / path).read_text(), flags=re.M)
    ]
    assert missing == []
