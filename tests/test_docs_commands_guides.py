"""Docs are code: the shell commands of the other docs pages run as
written (see tests/docs_commands.py for the short setting appended), or are marked as not
run with the reason."""

from __future__ import annotations

import pytest

from tests.docs_commands import DOCS, check, commands, sandbox

FIRST = ("README.md", "index.md", "getting-started.md")
MINE = [d for d in DOCS if d.name not in FIRST]
ALL = [c for doc in MINE for c in commands(doc)]
RUN = [c for c in ALL if c.not_run is None]


def test_every_command_runs_or_says_why_not():
    assert MINE and len(ALL) >= 15
    assert all(c.not_run.strip() for c in ALL if c.not_run is not None)


@pytest.fixture(scope="module")
def places(tmp_path_factory, data_dir):
    root = tmp_path_factory.mktemp("docs")
    return root, sandbox(root, data_dir)


@pytest.mark.slow
@pytest.mark.parametrize("command", RUN, ids=[f"{c.doc}:{c.line[:60]}" for c in RUN])
def test_documented_command(command, places, data_dir):
    root, where = places
    check(command, root, data_dir, where)
