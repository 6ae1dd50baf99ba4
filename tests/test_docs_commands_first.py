"""Docs are code: the shell commands of README.md, docs/index.md and docs/getting-started.md run as
written (tests/docs_commands.py: the short setting appended, placeholders filled), or are
marked as not run with the reason."""

import pytest

from tests.docs_commands import _doc_sandbox, make_doc_tests

doc_sandbox = pytest.fixture(scope="module")(_doc_sandbox)
test_every_command_runs_or_says_why_not, test_documented_command = make_doc_tests(first=True)
