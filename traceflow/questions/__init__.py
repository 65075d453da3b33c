"""Questions beyond one trace: check suites, the reachability audit, before/after diffs.

All three ask many (source, destination) questions of one bundle. ``runner.Tracer`` answers
them over one parsed Snapshot with a cache per question, so each node's files are parsed once
and a question asked twice is traced once.

    solver.py     Solver(snapshot).trace(Query): the walk over the CNI's datapath + intent
    components.py one engine on one node (ovs-trace, nf-trace, route-get), any CNI
    suite.py      the YAML suite of expectations (with file:line for every key)
    select.py     sources and destinations: pod, namespace/pod, deploy/NAME, label selector, IP
    runner.py     the shared Snapshot + per-question trace cache, progress display
    check.py      expectations against traces -> results (exit 0/1)
    backends.py   the kernel's "which backends does it balance to" (iptables, nft, IPVS);
                  a CNI's own balancers are read by its package (traceflow.cni)
    audit.py      Service port x client group matrix, and intent-vs-datapath drift
    diff.py       two bundles of one cluster: changed verdicts/paths, raw changes
"""
