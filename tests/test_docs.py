"""Docs are code: what the docs point at exists."""

from __future__ import annotations

import re

import pytest

from tests.helpers import REPO


@pytest.mark.parametrize(("doc", "at_least"), [("faults.md", 15), ("security.md", 25)])
def test_every_test_the_fault_and_security_tables_name_exists(doc, at_least):
    text = (REPO / "docs" / doc).read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", text)
    assert len(named) >= at_least
    missing = [
        f"{path}::{name}"
        for path, name in named
        if not re.search(rf"^def {name}\(", (REPO / path).read_text(), flags=re.M)
    ]
    assert missing == []
