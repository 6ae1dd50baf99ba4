"""The supply chain: no range admits a known-bad release, the lock matches pyproject, pip refuses
what the lock does not list (scripts/supply_chain.py, security/known-bad.toml, requirements/)."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.helpers import REPO

_spec = importlib.util.spec_from_file_location("supply_chain", REPO / "scripts" / "supply_chain.py")
supply_chain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(supply_chain)

# the torch wheel this machine's pip serves from disk (ENVIRONMENT.md); absent elsewhere
LOCAL_TORCH = Path("/opt/pypi-more/files/torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl")


@pytest.fixture(scope="module")
def known_bad() -> list[dict]:
    entries = supply_chain.load_known_bad()
    assert entries
    return entries


def test_no_range_in_pyproject_admits_a_known_bad_release():
    assert supply_chain.check_ranges() == []


@pytest.mark.parametrize(
    "requirement, expected",
    [
        # the range we had before issue 34: admits the compromised 2.6.2/2.6.3 and the vulnerable
        ("lightning>=2.4", ["2.6.2, 2.6.3: GHSA-w37p-236h-pfx3", "<2.6.6 (e.g. 2.4"]),
        ("lightning>=2.4,<2.7", ["GHSA-w37p-236h-pfx3", "CVE-2026-58659"]),
        ("lightning>=2.6.4,<2.7", ["CVE-2026-58659"]),
        ("lightning<3", ["GHSA-w37p-236h-pfx3", "(e.g. 0)"]),
        ("lightning", ["GHSA-w37p-236h-pfx3", "CVE-2026-58659"]),
        ("lightning>=2.6.6,<2.7", []),
        ("lightning==2.6.6", []),
        ("hydra-core>=1.3,<1.4", ["CVE-2026-68508", "CVE-2026-106439"]),
        ("hydra-core>=1.3.7,<1.4", []),
        # widening to 1.4 would admit the vulnerable 1.4 development releases (with --pre)
        ("hydra-core>=1.3.7,<1.5", ["1.4.0.dev0"]),
        # a pre-release pinned on purpose still counts
        ("hydra-core==1.4.0.dev9", ["1.4.0.dev9"]),
        ("torch>2.9.1", ["CVE-2026-24747"]),
        ("torch>=2.10", []),
        ("mlflow>=2.10", ["PYSEC-2026-2655"]),
        ("wandb>0.28.2", ["CVE-2026-91771"]),
        ("optuna>=3.5", []),
    ],
)
def test_the_range_check_catches_what_a_range_admits(requirement, expected, known_bad):
    found = supply_chain.admitted_bad(requirement, known_bad)
    assert bool(found) == bool(expected), found
    for fragment in expected:
        assert any(fragment in line for line in found), (fragment, found)


def test_putting_lightning_2_4_back_into_pyproject_fails_the_check(tmp_path):
    text = (REPO / "pyproject.toml").read_text()
    assert '"lightning>=2.6.6,<2.7"' in text
    bad = tmp_path / "pyproject.toml"
    bad.write_text(text.replace('"lightning>=2.6.6,<2.7"', '"lightning>=2.4"'))
    problems = supply_chain.check_ranges(bad)
    assert any("2.6.2, 2.6.3" in p for p in problems), problems
    assert supply_chain.check_ranges() == []


def test_a_known_bad_entry_without_an_advisory_is_refused(tmp_path):
    path = tmp_path / "known-bad.toml"
    path.write_text('[[release]]\npackage = "x"\nversions = ["1.0"]\nreason = "r"\n')
    with pytest.raises(supply_chain.SupplyChainError, match="advisory"):
        supply_chain.load_known_bad(path)


def test_the_lock_was_made_from_pyproject_as_it_is():
    assert supply_chain.check_lock() is None


def test_a_lock_older_than_a_pyproject_change_is_refused_with_one_line(tmp_path):
    text = (REPO / "pyproject.toml").read_text()
    changed = tmp_path / "pyproject.toml"
    # comments do not count, a changed range does
    changed.write_text(text.replace("[project]", "# a comment\n[project]"))
    assert supply_chain.check_lock(changed) is None
    changed.write_text(text.replace('"rich>=13"', '"rich>=13.1"'))
    message = supply_chain.check_lock(changed)
    assert message is not None and "\n" not in message
    assert message.startswith("error: ") and message.endswith("run `make lock`")


def test_every_pin_is_inside_pyproject_and_not_known_bad():
    pins = supply_chain.lock_pins()
    assert {"torch", "lightning", "hydra-core", "optuna", "setuptools"} <= pins.keys()
    assert supply_chain.check_pins(pins) == []
    # and the check can fail: a lock pinning a compromised release
    assert any("GHSA-w37p" in p for p in supply_chain.check_pins({**pins, "lightning": "2.6.3"}))


def test_every_pin_has_hashes_and_nothing_is_unpinned():
    text = supply_chain.LOCK.read_text()
    entries = re.split(r"\n(?=[A-Za-z0-9])", text)
    requirements = [e for e in entries if not e.startswith("#")]
    assert len(requirements) > 100
    for entry in requirements:
        assert re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*==\S+ \\\n", entry), entry[:80]
        assert "--hash=sha256:" in entry, entry[:80]


@pytest.mark.skipif(not LOCAL_TORCH.exists(), reason=f"{LOCAL_TORCH} is not on this machine")
def test_the_torch_wheel_on_this_disk_is_one_the_lock_allows():
    digest = hashlib.sha256()
    with open(LOCAL_TORCH, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    torch_entry = supply_chain.LOCK.read_text().split("\ntorch==", 1)[1].split("\n    # via")[0]
    assert f"--hash=sha256:{digest.hexdigest()}" in torch_entry


def _tiny_wheel(folder: Path, version: str) -> Path:
    """A minimal valid wheel of a package named `tinypkg`, built here (nothing downloads)."""
    name = f"tinypkg-{version}"
    files = {
        "tinypkg/__init__.py": b"",
        f"{name}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: tinypkg\nVersion: {version}\n".encode()
        ),
        f"{name}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{name}.dist-info/RECORD,,")
    files[f"{name}.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = folder / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
    return wheel


def _pip_dry_run(folder: Path, requirements: str) -> subprocess.CompletedProcess[str]:
    (folder / "req.txt").write_text(requirements)
    # --isolated: no user config or PIP_* variables; --no-index: only the folder we built
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--no-index"]
    cmd += ["--find-links", str(folder), "--require-hashes", "-r", str(folder / "req.txt")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_pip_installs_only_what_the_lock_lists_with_its_hash(tmp_path):
    wheel = _tiny_wheel(tmp_path, "1.0")
    _tiny_wheel(tmp_path, "1.1")
    good = hashlib.sha256(wheel.read_bytes()).hexdigest()
    ok = _pip_dry_run(tmp_path, f"tinypkg==1.0 --hash=sha256:{good}\n")
    assert ok.returncode == 0, ok.stderr
    assert "tinypkg-1.0" in ok.stdout

    # a wheel whose hash the lock does not list
    other = _pip_dry_run(tmp_path, f"tinypkg==1.0 --hash=sha256:{'0' * 64}\n")
    assert other.returncode != 0
    assert "DO NOT MATCH THE HASHES" in other.stderr

    # another version than the pinned one: its file's hash is not listed either
    newer = _pip_dry_run(tmp_path, f"tinypkg==1.1 --hash=sha256:{good}\n")
    assert newer.returncode != 0
    assert "DO NOT MATCH THE HASHES" in newer.stderr

    # a range instead of a pin is refused before anything is fetched
    loose = _pip_dry_run(tmp_path, f"tinypkg>=1.0 --hash=sha256:{good}\n")
    assert loose.returncode != 0
    assert "pinned with ==" in loose.stderr
