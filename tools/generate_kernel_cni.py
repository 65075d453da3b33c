"""Write the kernel CNI example bundles.

    python tools/generate_kernel_cni.py OUTDIR [NAME ...]

writes ``OUTDIR/flannel-vxlan``, ``OUTDIR/flannel-dualstack``, ``OUTDIR/calico-vxlan``, ``OUTDIR/calico-dualstack``, ``OUTDIR/aws-vpc-cni`` and
``OUTDIR/azure-cni`` (or only the NAMEs given). A maintainers' tool, not installed with
traceflow: the bundles it writes are shipped in traceflow/examples/ (their README.md and
checks.yaml are written by hand and kept).

How faithful it is. Each file is written in the form of real public outputs of that CNI, named
per file in the manifest's ``provenance`` (the line forms, device names, chain names, comments
and order the CNI and iproute2/iptables print); the clusters (names, addresses, MACs) are made
up, derived from names so that the output is reproducible. tests/test_kernel_cni_lab.py builds
each example's nodes as network namespaces from these very files and checks the kernel agrees
with the traces.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kernel_cni_gen import bundle  # noqa: E402


def examples() -> dict:
    from kernel_cni_gen import flannel
    from kernel_cni_gen import flannel_dualstack
    out = {"flannel-vxlan": flannel.build, "flannel-dualstack": flannel_dualstack.build}
    try:
        from kernel_cni_gen import calico
        out["calico-vxlan"] = calico.build
        from kernel_cni_gen import calico_dualstack
        out["calico-dualstack"] = calico_dualstack.build
    except ImportError:
        pass
    try:
        from kernel_cni_gen import aws
        out["aws-vpc-cni"] = aws.build
    except ImportError:
        pass
    try:
        from kernel_cni_gen import azure
        out["azure-cni"] = azure.build
    except ImportError:
        pass
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    out = Path(argv[0])
    wanted = argv[1:] or list(examples())
    for name in wanted:
        path = bundle.write(examples()[name](), out)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
