"""Write one example bundle: manifest (with per-file provenance), k8s/*.yaml, node and pod files."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import yaml

from kernel_cni_gen import host, kube


@dataclass
class Example:
    name: str
    header: str                     # the manifest's leading comment
    manifest: dict                  # cni, cni_version, kube_proxy, description ...
    nodes: list
    pods: list
    services: list
    policies: list = field(default_factory=list)
    provenance: dict = field(default_factory=dict)   # file -> {origin, detail}
    extra_files: dict = field(default_factory=dict)  # relative path -> text
    pod_files: tuple = ("ip-addr.txt", "ip-route.txt", "ip-neigh.txt")


def write(example: Example, out: Path) -> Path:
    root = out / example.name
    root.mkdir(parents=True, exist_ok=True)
    files: dict[str, str] = {
        "k8s/nodes.yaml": kube.nodes_yaml(example.nodes),
        "k8s/pods.yaml": kube.pods_yaml(example.pods),
        "k8s/services.yaml": kube.services_yaml(example.services),
        "k8s/endpointslices.yaml": kube.endpointslices_yaml(example.services),
        "k8s/networkpolicies.yaml": kube.networkpolicies_yaml(example.policies),
    }
    for n in example.nodes:
        base = f"nodes/{n.name}/"
        files[base + "ip-addr.txt"] = host.ip_addr(n.ifaces)
        files[base + "ip-link.txt"] = host.ip_link(n.ifaces)
        files[base + "ip-route.txt"] = "\n".join(n.routes) + "\n"
        files[base + "ip-rule.txt"] = "\n".join(n.rules or host.DEFAULT_RULES) + "\n"
        files[base + "ip-neigh.txt"] = "\n".join(n.neigh) + "\n"
        files[base + "bridge-fdb.txt"] = "\n".join(n.fdb) + "\n"
        files[base + "sysctl.txt"] = "\n".join(n.sysctl) + "\n"
        files[base + "iptables-save.txt"] = n.iptables
        if getattr(n, "ip6tables", None) is not None:
            files[base + "ip6tables-save.txt"] = n.ip6tables
        if n.ipset is not None:
            files[base + "ipset.txt"] = n.ipset
    for p in example.pods:
        base = f"pods/{p.namespace}/{p.name}/"
        texts = {"ip-addr.txt": p.ip_addr(), "ip-route.txt": "\n".join(p.routes) + "\n",
                 "ip-neigh.txt": "\n".join(p.neigh) + ("\n" if p.neigh else "")}
        for f in example.pod_files:
            files[base + f] = texts[f]
    files.update(example.extra_files)
    manifest = {"format": "traceflow-bundle/v1", **example.manifest,
                "provenance": {f: example.provenance.get(f, _default(f)) for f in sorted(files)}}
    files["manifest.yaml"] = example.header + yaml.safe_dump(manifest, sort_keys=False,
                                                              width=100)
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _default(rel: str) -> dict:
    return {"origin": "synthesised", "detail": "written by tools/generate_kernel_cni.py"}
