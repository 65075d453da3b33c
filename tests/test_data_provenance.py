"""tests/data holds every file the tests read, each listed with its SHA-256 in PROVENANCE.md."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
INDEX = DATA / "PROVENANCE.md"


def _listed() -> dict[str, str]:
    rows = re.findall(r"^\| `([^`]+)` \| `([0-9a-f]{64})` \|", INDEX.read_text(), re.M)
    return dict(rows)


def test_every_data_file_is_listed_with_its_hash():
    listed = _listed()
    present = {p.relative_to(DATA).as_posix() for p in DATA.rglob("*")
               if p.is_file() and p != INDEX}
    assert present - set(listed) == set(), "files in tests/data missing from PROVENANCE.md"
    assert set(listed) - present == set(), "PROVENANCE.md lists files that are not there"
    for rel, digest in listed.items():
        assert hashlib.sha256((DATA / rel).read_bytes()).hexdigest() == digest, rel


def test_realworld_copies_match_the_corpus_index():
    """The corpus's own index gives each file's size and hash prefix as published: the
    copies here are those bytes."""
    index = (DATA / "realworld" / "INDEX.md").read_text()
    entries = re.findall(r"^### `([^`]+)`\n(?:.*\n)*?- Size: [^;]*?(\d+) bytes; sha256 `([0-9a-f]+)",
                         index, re.M)
    assert len(entries) >= 59
    for rel, size, prefix in entries:
        data = (DATA / "realworld" / rel).read_bytes()
        assert len(data) == int(size), rel
        assert hashlib.sha256(data).hexdigest().startswith(prefix), rel


def test_tests_never_read_outside_the_repository():
    outside = ("/" + "work/", "\"sha" + "red\"", "parents" + "[2]")
    for test in Path(__file__).resolve().parent.glob("*.py"):
        text = test.read_text()
        assert not [o for o in outside if o in text], test.name
