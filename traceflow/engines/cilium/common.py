"""What every Cilium parser shares: the Cilium version, source lines, located errors, JSON."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from traceflow.model.errors import InputError, Source

# An address with a port: 10.0.0.1:80, [fd00::1]:80, with an optional /PROTO and /i (internal scope)
ADDR = r"(?P<ip>\[[0-9a-fA-F:.]+\]|[0-9.]+|[0-9a-fA-F:]+):(?P<port>\d+)"
PROTOS = ("TCP", "UDP", "SCTP", "ICMP", "ICMPv6", "ANY", "NONE")
# "/PROTO" after an address: TCP, UDP, SCTP, ICMPv6, ANY (upper-case first, so never the `/i` scope)
PROTO = r"(?:/(?P<{0}>[A-Z][A-Za-z0-9]*))?"
SERVICE_TYPES = ("ClusterIP", "NodePort", "ExternalIPs", "HostPort", "LoadBalancer",
                 "LocalRedirect")


@dataclass(frozen=True, order=True)
class CiliumVersion:
    """major.minor.patch of the agent; formats and lookup rules are chosen by it."""

    major: int
    minor: int
    patch: int = 0

    @classmethod
    def parse(cls, text: str) -> "CiliumVersion":
        m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(text))
        if not m:
            raise ValueError(f"not a Cilium version: {text!r}")
        return cls(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}"

    def at_least(self, major: int, minor: int) -> bool:
        return (self.major, self.minor) >= (major, minor)


def as_version(version) -> CiliumVersion | None:
    """None, a CiliumVersion, or text like "v1.16.8" / "1.8" -> CiliumVersion or None."""
    if version is None or isinstance(version, CiliumVersion):
        return version
    return CiliumVersion.parse(str(version))


_STATUS_VERSION = re.compile(r"^\s*Cilium:\s+Ok\s+(?P<v>v?\d+\.\d+\.\d+)", re.M)
_STATUS_VERSION_ALT = re.compile(r"^\s*(?:Cilium version|Client|Daemon):\s+(?P<v>v?\d+\.\d+\.\d+)", re.M)


def detect_version(manifest_cni_version: str | None = None,
                   status_text: str | None = None) -> CiliumVersion | None:
    """The Cilium version: the manifest's ``cni_version`` first, else the `cilium status` line
    ``Cilium:   Ok   1.16.8 (v1.16.8-...)``; None when neither says."""
    if manifest_cni_version:
        try:
            return CiliumVersion.parse(manifest_cni_version)
        except ValueError:
            raise InputError(f"cni_version {manifest_cni_version!r} is not a Cilium version "
                             "(expected like v1.16.8)", "manifest.yaml") from None
    if status_text:
        m = _STATUS_VERSION.search(status_text) or _STATUS_VERSION_ALT.search(status_text)
        if m:
            return CiliumVersion.parse(m.group("v"))
    return None


MAX_LINE = 16384     # no Cilium output line comes near this; a longer one is not an output


def lines(text: str, path: str):
    """Non-blank lines as Sources (1-based line numbers). A line longer than MAX_LINE is an
    error: it keeps every parser's per-line work bounded on a hostile bundle."""
    for n, raw in enumerate(text.splitlines(), 1):
        if len(raw) > MAX_LINE:
            raise InputError(f"line longer than {MAX_LINE} characters: not a Cilium output",
                             path, n, raw[:200] + "...")
        if raw.strip():
            yield Source(path, n, raw)


def bad(src: Source, what: str, why: str = "") -> InputError:
    return InputError.at(src, f"not a `{what}` line{': ' + why if why else ''} "
                              "(an output format traceflow does not know)")


def ip(text: str) -> str:
    return text.strip("[]")


def is_json(text: str) -> bool:
    return text.lstrip()[:1] in ("{", "[")


def load_json(text: str, path: str):
    try:
        return json.loads(text)
    except RecursionError:
        raise InputError("JSON nested too deeply", path) from None
    except json.JSONDecodeError as e:
        raise InputError(f"not valid JSON: {e.msg}", path, e.lineno,
                         text.splitlines()[e.lineno - 1] if text.splitlines() else "") from None


def json_source(path: str, index: int, obj) -> Source:
    """A Source for the index-th (1-based) object of a JSON document."""
    return Source(path, index, json.dumps(obj, separators=(",", ":"))[:500])


def json_error(path: str, where: str, why: str) -> InputError:
    return InputError(f"{where}: {why} (a JSON shape traceflow does not know)", path)
