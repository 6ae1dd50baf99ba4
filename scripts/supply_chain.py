"""The lock file and the known-bad releases: checks for `make install`, `make lock` and the tests.

Commands (each answers with one line and exit 1 on a finding, exit 2 on a file it cannot read)::

    python3 scripts/supply_chain.py check-lock       # the lock was made from pyproject as it is
    python3 scripts/supply_chain.py finish-lock RAW OUT  # pip-compile's output -> our lock
    python3 scripts/supply_chain.py audit [--files]  # the installed environment against the lock

`check-lock` and `finish-lock` use the standard library only: `make install` runs them with the
system python3 before the venv exists. The known-bad checks need `packaging` (in the venv).
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 has no tomllib; pip carries the same parser
    from pip._vendor import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = REPO / "pyproject.toml"
LOCK = REPO / "requirements" / "lock.txt"
CONSTRAINTS = REPO / "requirements" / "machine-constraints.txt"
KNOWN_BAD = REPO / "security" / "known-bad.toml"

DIGEST_LINE = "# pyproject-sha256: "
# what pip-compile writes for our own package when the dev extra names `experiments[export,ray]`:
# a path without a hash, which --require-hashes would refuse; the project is installed on its own
_SELF_REFERENCE = re.compile(r"^experiments @ file:")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^ \\;]+)")


class SupplyChainError(Exception):
    """A file we need is missing or unreadable (exit 2)."""


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise SupplyChainError(f"{path.name} not found at {path}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise SupplyChainError(f"{path.name} is not valid TOML: {e}") from None


def dependency_digest(pyproject: Path = PYPROJECT, constraints: Path = CONSTRAINTS) -> str:
    """sha256 of everything the lock is resolved from, so a lock made before a change is caught.

    That is pyproject's dependency lists (runtime, extras, build requirements, Python range) and
    the machine constraints; comments and formatting do not count.
    """
    project = _read_toml(pyproject)
    lists = {
        "requires-python": project.get("project", {}).get("requires-python"),
        "dependencies": project.get("project", {}).get("dependencies", []),
        "optional-dependencies": project.get("project", {}).get("optional-dependencies", {}),
        "build-requires": project.get("build-system", {}).get("requires", []),
        "constraints": _requirement_lines(constraints) if constraints.exists() else [],
    }
    blob = json.dumps(lists, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def _requirement_lines(path: Path) -> list[str]:
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def lock_digest(lock: Path = LOCK) -> str | None:
    """The digest written in the lock's header by `finish-lock`, or None."""
    try:
        text = lock.read_text()
    except FileNotFoundError:
        raise SupplyChainError(f"{_rel(lock)} not found: run `make lock`") from None
    for line in text.splitlines():
        if line.startswith(DIGEST_LINE):
            return line[len(DIGEST_LINE) :].strip()
    return None


def check_lock(pyproject: Path = PYPROJECT, lock: Path = LOCK) -> str | None:
    """One line saying why the lock does not match pyproject, or None when it does."""
    if lock_digest(lock) != dependency_digest(pyproject):
        return (
            f"error: {_rel(lock)} was made for other dependencies than {_rel(pyproject)}'s "
            "(a range, an extra or a constraint changed since): run `make lock`"
        )
    return None


def finish_lock(raw: str, digest: str) -> str:
    """pip-compile's output with our header line and without the project's own entry."""
    out: list[str] = []
    skipping = False
    for line in raw.splitlines():
        if line.startswith((DIGEST_LINE, "# ^ dependency lists", "#   was resolved from")):
            continue
        if _SELF_REFERENCE.match(line):
            # drop the entry and the pip-compile warning lines right above it
            while (
                out
                and out[-1].startswith("# WARNING")
                or out
                and out[-1].startswith("# Consider using a hashable URL")
            ):
                out.pop()
            skipping = True
            continue
        if skipping and line.startswith("    "):
            continue
        skipping = False
        out.append(line)
    header = [
        f"{DIGEST_LINE}{digest}",
        "# ^ dependency lists of pyproject.toml + requirements/machine-constraints.txt this lock",
        "#   was resolved from; `make install` refuses the lock when they differ: run `make lock`.",
    ]
    return "\n".join(header + out) + "\n"


def lock_pins(lock: Path = LOCK) -> dict[str, str]:
    """Canonical package name -> pinned version in the lock."""
    pins = {}
    for line in lock.read_text().splitlines():
        m = _PIN.match(line)
        if m:
            pins[canonical(m.group(1))] = m.group(2)
    return pins


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


# ---- known-bad releases (needs `packaging`) -------------------------------------------------


def load_known_bad(path: Path = KNOWN_BAD) -> list[dict]:
    """The entries of security/known-bad.toml, each checked for the keys it must have."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    entries = _read_toml(path).get("release", [])
    if not entries:
        raise SupplyChainError(f"{_rel(path)} lists no [[release]] entries")
    for i, entry in enumerate(entries, 1):
        where = f"{_rel(path)} entry {i} ({entry.get('package', '?')})"
        missing = [k for k in ("package", "advisory", "reason") if not entry.get(k)]
        if missing or ("versions" in entry) == ("range" in entry):
            raise SupplyChainError(
                f"{where}: needs package, advisory, reason and exactly one of versions/range"
            )
        try:
            if "range" in entry:
                SpecifierSet(entry["range"])
            else:
                [Version(v) for v in entry["versions"]]
        except (InvalidSpecifier, InvalidVersion) as e:
            raise SupplyChainError(f"{where}: {e}") from None
    return entries


def _just_above(version) -> str:
    """A version right above ``version`` with nothing released between them in practice."""
    if version.dev is not None:
        return re.sub(r"dev\d+$", f"dev{version.dev + 1}", str(version))
    if version.post is not None:
        return re.sub(r"post\d+$", f"post{version.post + 1}", str(version))
    if version.pre is not None:
        return f"{version}.post0"
    return f"{version.base_version}.0.0.0.1"


def _probes(*specifier_sets) -> list:
    """Versions at and right above every bound of the given sets, plus the lowest version.

    Each set is a union of intervals whose ends are its bounds, so where two of them overlap, the
    lowest point of the overlap is one of these probes (or just above it).
    """
    from packaging.version import InvalidVersion, Version

    found = {Version("0")}
    for specs in specifier_sets:
        for spec in specs:
            try:
                v = Version(spec.version.removesuffix(".*"))
            except InvalidVersion:
                continue
            found |= {v, Version(_just_above(v))}
    return sorted(found)


def admitted_bad(requirement: str, entries: list[dict]) -> list[str]:
    """The known-bad releases a requirement string admits, one line each ("" when none).

    Pre-releases count: `pip install --pre` or a `==` pin would reach them.
    """
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    req = Requirement(requirement)
    found = []
    for entry in entries:
        if canonical(entry["package"]) != canonical(req.name):
            continue
        if "versions" in entry:
            hits = [v for v in entry["versions"] if req.specifier.contains(v, prereleases=True)]
        else:
            bad = SpecifierSet(entry["range"])
            hits = [
                str(v)
                for v in _probes(req.specifier, bad)
                if req.specifier.contains(v, prereleases=True) and bad.contains(v, prereleases=True)
            ][:1]
        if hits:
            what = ", ".join(hits) if "versions" in entry else f"{entry['range']} (e.g. {hits[0]})"
            found.append(f"{requirement!r} admits {req.name} {what}: {entry['advisory']}")
    return found


def project_requirements(pyproject: Path = PYPROJECT) -> list[str]:
    """Every requirement in pyproject: runtime, each extra and the build system (not ourselves)."""
    data = _read_toml(pyproject)
    project = data.get("project", {})
    reqs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        reqs += extra
    reqs += data.get("build-system", {}).get("requires", [])
    own = canonical(project.get("name", ""))
    return [r for r in reqs if canonical(re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0]) != own]


def check_ranges(pyproject: Path = PYPROJECT, known_bad: Path = KNOWN_BAD) -> list[str]:
    """Every known-bad release some range in pyproject admits."""
    entries = load_known_bad(known_bad)
    return [line for req in project_requirements(pyproject) for line in admitted_bad(req, entries)]


def check_pins(
    pins: dict[str, str], pyproject: Path = PYPROJECT, known_bad: Path = KNOWN_BAD
) -> list[str]:
    """Pinned versions outside pyproject's ranges, missing from the pins, or known bad."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    problems = []
    for text in project_requirements(pyproject):
        req = Requirement(text)
        name = canonical(req.name)
        if req.marker is not None and not req.marker.evaluate():
            continue
        if name not in pins:
            problems.append(f"{req.name} ({text}) is not pinned")
        elif not req.specifier.contains(pins[name], prereleases=True):
            problems.append(f"{req.name}=={pins[name]} is outside {text!r}")
    for entry in load_known_bad(known_bad):
        version = pins.get(canonical(entry["package"]))
        if version is None:
            continue
        bad = entry.get("versions") or []
        if version in bad or (
            "range" in entry and SpecifierSet(entry["range"]).contains(version, prereleases=True)
        ):
            problems.append(f"{entry['package']}=={version} is known bad: {entry['advisory']}")
    return problems


# ---- the installed environment --------------------------------------------------------------


def installed_versions() -> dict[str, str]:
    """Canonical name -> version of every distribution this interpreter sees."""
    from importlib.metadata import distributions

    return {canonical(d.metadata["Name"]): d.version for d in distributions() if d.metadata["Name"]}


def unrecorded_files() -> list[str]:
    """Installed files whose sha256 differs from the one pip wrote in the package's RECORD.

    This catches a file edited after install (by hand or by a package's own code); it cannot
    catch an attacker who rewrites RECORD too, which is what the lock's wheel hashes are for.
    """
    import base64
    from importlib.metadata import distributions

    changed = []
    for dist in distributions():
        record = dist.read_text("RECORD")
        if not record:
            continue
        base = Path(dist.locate_file(""))
        for row in csv.reader(record.splitlines()):
            if len(row) < 2 or not row[1].startswith("sha256="):
                continue
            path = base / row[0]
            try:
                digest = hashlib.sha256(path.read_bytes()).digest()
            except FileNotFoundError:
                changed.append(f"{dist.metadata['Name']}: {row[0]} is missing")
                continue
            expected = row[1].removeprefix("sha256=")
            if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != expected:
                changed.append(f"{dist.metadata['Name']}: {row[0]} differs from its RECORD")
    return changed


def audit(files: bool = False, lock: Path = LOCK) -> list[str]:
    """What in this environment differs from the lock or is known bad, one line each."""
    pins = lock_pins(lock)
    have = installed_versions()
    own = canonical(_read_toml(PYPROJECT)["project"]["name"])
    # installed by `python -m venv` itself, not by the lock
    ignore = {own, "pip"}
    problems = [
        f"{name}=={version} is installed but "
        + (f"the lock pins {pins[name]}" if name in pins else "is not in the lock")
        for name, version in sorted(have.items())
        if name not in ignore and pins.get(name) != version
    ]
    problems += [
        f"{name}=={v} is in the lock but not installed"
        for name, v in pins.items()
        if name not in have
    ]
    problems += check_pins(have)
    if files:
        problems += unrecorded_files()
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    chk = sub.add_parser("check-lock", help="exit 1 when the lock was made from other dependencies")
    chk.add_argument("lock", type=Path, nargs="?", default=LOCK)
    fin = sub.add_parser("finish-lock", help="turn pip-compile's output into the committed lock")
    fin.add_argument("raw", type=Path)
    fin.add_argument("out", type=Path)
    aud = sub.add_parser("audit", help="compare the installed environment with the lock")
    aud.add_argument("--files", action="store_true", help="also check every file against RECORD")
    args = parser.parse_args(argv)
    try:
        if args.command == "check-lock":
            problem = check_lock(lock=args.lock)
            if problem:
                print(problem, file=sys.stderr)
                return 1
            return 0
        if args.command == "finish-lock":
            args.out.write_text(finish_lock(args.raw.read_text(), dependency_digest()))
            args.raw.unlink()
            problems = check_pins(lock_pins(args.out)) + check_ranges()
        else:
            problems = audit(files=args.files)
    except SupplyChainError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for line in problems:
        print(f"error: {line}", file=sys.stderr)
    if not problems and args.command == "audit":
        print(f"ok: every installed distribution matches {_rel(LOCK)}; none is known bad")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
