"""traceflow.bundle.fastyaml gives exactly what yaml.safe_load gives, on every YAML file of the
examples and test data and on the YAML features kubectl and PyYAML write; what it leaves to
PyYAML (explicit tags, merge keys, several documents) is said, and load_yaml still locates
errors."""

from pathlib import Path

import pytest
import yaml

from traceflow.bundle import fastyaml
from traceflow.model.errors import InputError
from traceflow.bundle.validate import load_yaml

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted(p for d in ("traceflow/examples", "tests/data") for p in (ROOT / d).rglob("*.yaml"))


def _same(text: str) -> None:
    want = yaml.safe_load(text)
    got = fastyaml.load(text)
    assert got == want
    assert repr(got) == repr(want)        # same types too (1 vs True vs "1")


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_bundle_yaml_file_loads_as_safe_load(path):
    text = path.read_text(encoding="utf-8", errors="replace")
    try:
        yaml.safe_load(text)
    except yaml.YAMLError:
        pytest.skip("not YAML (a bad-input fixture)")
    try:
        _same(text)
    except fastyaml.Unusual:
        pass                               # left to PyYAML: load_yaml falls back


SCALARS = """
int: 80
octal: 0o17
old_octal: 017
hex: 0x1f
sexagesimal: 1:30
float: 1.5e3
inf: .inf
bools: [yes, No, true, FALSE, on, off]
nulls: [~, null, ""]
quoted: ["80", '080', "true"]
stamp: 2020-09-14T15:20:41Z
date: 2020-09-14
block: |
  two
  lines
folded: >
  one
  line
80: an int key
true: a bool key
dup: 1
dup: 2
empty_map: {}
flow: {a: 1, b: [x, 'y']}
"""


def test_scalar_types_are_resolved_as_safe_load_does():
    _same(SCALARS)


def test_anchors_and_aliases_share_the_object_as_safe_load_does():
    text = "a: &p\n- port: 80\nb: *p\nc: &s text\nd: *s\n"
    _same(text)
    doc = fastyaml.load(text)
    assert doc["a"] is doc["b"]


def test_item_lines_are_recorded():
    lines: list = []
    fastyaml.load("apiVersion: v1\nitems:\n- kind: Pod\n  a: 1\n- kind: Pod\nkind: List\n", lines)
    assert lines == [3, 5]


@pytest.mark.parametrize("text", ["a: !!str 80\n", "base: &b {x: 1}\nc:\n  <<: *b\n",
                                  ])
def test_what_kubectl_does_not_write_is_left_to_pyyaml(text):
    with pytest.raises(fastyaml.Unusual):
        fastyaml.load(text)
    assert load_yaml(text, "k8s/x.yaml") == yaml.safe_load(text)


@pytest.mark.parametrize("text,line", [("a: 1\n---\nb: 2\n", 2), ("? [a, b]\n: c\n", 1)])
def test_what_pyyaml_rejects_is_left_to_it_and_located(text, line):
    with pytest.raises(fastyaml.Unusual):
        fastyaml.load(text)
    with pytest.raises(InputError, match=f"line {line}"):
        load_yaml(text, "k8s/x.yaml")


def test_invalid_yaml_is_still_a_located_error():
    with pytest.raises(InputError) as err:
        load_yaml("items:\n- a: 1\n  b: [unclosed\n", "k8s/pods.yaml")
    assert err.value.args and "k8s/pods.yaml" in str(err.value)
    assert "line" in str(err.value)
