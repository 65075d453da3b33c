"""What a bundle says about its own collection, and what that means for a trace.

``traceflow collect`` records in ``manifest.yaml`` (compatible extensions of v1, see
docs/bundle-v1.md):

- ``collection_errors:`` entries with ``kind:`` for a Kubernetes list the API did not give
  (403, 500, a stall, a cut connection, the deadline): ``file`` is the bundle file that is
  missing, ``missing`` says why in one word (forbidden, api-error, deadline, ...);
- ``not_installed:`` the CRD lists (and ConfigMaps) the cluster does not serve (404);
- ``truncated:`` file -> {kept_bytes, reason}: a file cut at a cap or by a time limit;
- ``dropped_keys:`` file -> the key names an allow-list kept out (never values).

``annotate`` adds to a trace the warnings that follow from them: which of its conclusions a
missing kind affects, and every truncated file the trace read.
"""

from __future__ import annotations

# bundle file -> what a trace cannot conclude without it
EFFECTS = {
    "k8s/pods.yaml": "pods cannot be named or resolved (sources, endpoints, owners of IPs)",
    "k8s/services.yaml": "Services and their ports cannot be resolved",
    "k8s/endpointslices.yaml": "a Service's endpoints are only what the datapath shows",
    "k8s/nodes.yaml": "node addresses and pod CIDRs are unknown (tunnel peers, node IPs)",
    "k8s/networkpolicies.yaml": "policy explanations cannot name the NetworkPolicy behind a "
                                "drop, nor say that none selects a pod",
}
# a CNI's own files (policy CRDs, its ConfigMap) are described by its conventions'
# ``collected_file_effects``


def _manifest(bundle) -> dict:
    m = getattr(bundle, "manifest", None)
    return m if isinstance(m, dict) else {}


def not_collected(manifest: dict) -> dict[str, str]:
    """bundle file -> why the API did not give it (the manifest's kind entries)."""
    out = {}
    for e in manifest.get("collection_errors") or []:
        if isinstance(e, dict) and e.get("kind") and isinstance(e.get("file"), str) \
                and e.get("kind") != "query":
            out.setdefault(e["file"], str(e.get("reason") or e.get("missing") or "not collected"))
    return out


def truncated(manifest: dict) -> dict[str, dict]:
    t = manifest.get("truncated")
    return {k: (v if isinstance(v, dict) else {}) for k, v in t.items()} \
        if isinstance(t, dict) else {}


def policies_missing(bundle) -> str | None:
    """Why the NetworkPolicies are not in the bundle, when the collection says they were not
    collected (None otherwise)."""
    return not_collected(_manifest(bundle)).get("k8s/networkpolicies.yaml")


def summary(errors: list) -> str:
    """One line for the end of a live command: what could not be collected."""
    nodes = sorted({str(e.get("node")) for e in errors
                    if isinstance(e, dict) and "file" not in e and "kind" not in e})
    kinds = [e["file"] for e in errors if isinstance(e, dict) and e.get("kind")
             and e.get("kind") != "query"]
    files = [e["file"] for e in errors if isinstance(e, dict) and "file" in e
             and not e.get("kind")]
    query = [e for e in errors if isinstance(e, dict) and e.get("kind") == "query"]
    parts = []
    if query:
        parts.append(f"the query could not be resolved ({query[0].get('reason')})")
    if kinds:
        parts.append(f"Kubernetes list(s) not collected: {', '.join(kinds)}")
    if nodes:
        parts.append(f"node(s) {', '.join(nodes)} could not be collected")
    if files:
        parts.append(f"{len(files)} needed file(s) missing ({', '.join(files[:4])}"
                     + (", ..." if len(files) > 4 else "") + ")")
    return "collection failed: " + "; ".join(parts or ["see the manifest"])


def blocking(errors: list) -> list:
    """The collection errors that make a live command exit 3: all but the optional kinds
    (policy CRDs, cilium-config) a trace goes on without, saying so."""
    return [e for e in errors or [] if not (isinstance(e, dict) and e.get("optional"))]


def query_failure(manifest: dict) -> str | None:
    for e in manifest.get("collection_errors") or []:
        if isinstance(e, dict) and e.get("kind") == "query":
            return str(e.get("reason"))
    return None


def annotate(snapshot, trace) -> None:
    """Warnings on ``trace`` for what the collection lacked: every kind not collected (with
    the conclusions it affects) and every truncated file the trace read."""
    bundle = snapshot.bundle
    m = _manifest(bundle)
    warnings = []
    for file, why in sorted(not_collected(m).items()):
        own = getattr(getattr(snapshot, "conventions", None), "collected_file_effects", {})
        effect = EFFECTS.get(file) or own.get(file) or "its objects are not in the bundle"
        warnings.append(f"{file} was not collected ({why}): {effect}")
    read = getattr(bundle, "read_names", None)
    for file, facts in sorted(truncated(m).items()):
        if read is not None and file not in read:
            continue
        kept = facts.get("kept_bytes")
        warnings.append(f"{file} is truncated ({facts.get('reason') or 'cut off'}"
                        + (f"; {kept} bytes kept" if kept is not None else "")
                        + "): what it lacks past the cut is unknown to this trace")
    warnings += list(getattr(snapshot, "notes", []))
    warnings += [w for w in empty_files_read(bundle)
                 if not any(w.split(" ", 1)[0] + " is empty" in x for x in warnings)]
    warnings += both_forms(bundle)
    if warnings:
        trace.warnings = list(dict.fromkeys(list(trace.warnings) + warnings))
    _unknown_on_truncated(m, read, trace)


def empty_files_read(bundle) -> list[str]:
    """A 0-byte node or pod file the trace read: taken as "nothing there", though an empty
    capture is more often a failed one."""
    out = []
    for name in sorted(getattr(bundle, "read_names", ()) or ()):
        if not name.startswith(("nodes/", "pods/")):
            continue
        is_empty = getattr(bundle, "is_empty", None)
        if is_empty is not None:
            empty = is_empty(name)
        else:
            raw = bundle.raw(name)
            empty = raw is not None and not raw.strip()
        if empty:
            out.append(f"{name} is empty (0 bytes): read as an empty table; an empty capture "
                       "is more often a failed one")
    return out


def both_forms(bundle) -> list[str]:
    """``k8s/<kind>.yaml`` and ``k8s/<kind>.jsonl`` both in the bundle: the rule (the .yaml is
    read, the .jsonl only when the .yaml is absent), stated."""
    names = set(bundle.names()) if hasattr(bundle, "names") else set()
    out = []
    for name in sorted(n for n in names if n.startswith("k8s/") and n.endswith(".jsonl")):
        yaml_name = name.removesuffix(".jsonl") + ".yaml"
        if yaml_name in names:
            out.append(f"{yaml_name} and {name} are both in the bundle: {yaml_name} is read and "
                       f"{name} is ignored (a .jsonl is read only when its .yaml is absent)")
    return out


def _unknown_on_truncated(manifest: dict, read, trace) -> None:
    """A path whose verdict rests on a truncated file (one of its hops reads it) and that
    ended with no rule matching there could be decided by the part that was cut: it becomes
    unknown, saying so."""
    cut = set(truncated(manifest))
    if not cut or read is None or not (cut & set(read)):
        return
    from traceflow.model.trace import Verdict
    for path in getattr(trace, "paths", []):
        files = {str(getattr(getattr(h, "source", None), "file", "") or "")
                 for leg in path.legs for h in leg.hops}
        files |= {str(f).split(":", 1)[0] for leg in path.legs for h in leg.hops
                  for f in [getattr(h, "file", None)] if f}
        hit = sorted(f for f in cut if f in files)
        if hit and path.verdict != Verdict.DELIVERED:
            path.verdict = Verdict.UNKNOWN
            note = (f"{', '.join(hit)} is truncated: the rule that decides this path may be in "
                    "the part that was cut")
            if note not in trace.warnings:
                trace.warnings.append(note)
