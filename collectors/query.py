"""The query of a live collection (source, destination, port) resolved against what the API
returned: names by the collector's rules (collectors/kube.py), IPs and ``svc/`` sources by
exactly the rules a bundle trace uses (traceflow/questions/resolve.py); a list the query needs that was
not collected is a CollectionError naming it."""

from __future__ import annotations

from traceflow.model.errors import CollectionError


def _yaml(doc) -> bytes:
    from collectors.output import _yaml as dump
    return dump(doc)


def _by_bundle_rules(state, ref: str, namespace: str, role: str, what: str) -> dict | None:
    """An IP or a ``svc/`` reference resolved by the rules a bundle trace uses
    (traceflow.questions.resolve: a pod's IP, a node's IP for its hostNetwork pods, a Service's cluster
    IP, a Service as a source refused with the same advice), over what the API returned: the
    object it names, or None when ``ref`` is neither an IP nor a ``svc/`` reference."""
    import ipaddress
    from traceflow.questions import resolve as R
    try:
        ipaddress.ip_address(ref.strip())
        is_ip = True
    except ValueError:
        is_ip = False
    if not is_ip and not (role == "source" and ref.startswith(R.SVC_PREFIXES)):
        return None
    from collectors import kube as K
    from traceflow.bundle.kube import load_cluster
    texts = {f"k8s/{f}": _yaml(K.list_document(items)).decode()
             for f, items in state.objects.items()}
    cluster = load_cluster(texts.get)
    if what == "service":
        got = R.service(cluster, ref, namespace)
        return state.service(got.namespace, got.name)
    got = R.pod(cluster, ref, namespace, role)
    return state.pod(got.namespace, got.name)


def _resolve(opts, kube, state, notes: list, warn, api_errors=()):
    """(query facts for the manifest, nodes the trace touches, pods to exec into).
    CollectionError when a kind the query needs was not collected (``api_errors``)."""
    from collectors import kube as K
    if opts.source is None and opts.selector is None and opts.destination is None:
        return None, [], []
    missing = {e["file"]: e["reason"] for e in api_errors if "kind" in e}

    def need(file: str, what: str) -> None:
        if f"k8s/{file}" in missing:
            raise CollectionError(f"cannot resolve {what}: k8s/{file} was not collected "
                                  f"({missing[f'k8s/{file}']})")
    if opts.selector is None:
        need("pods.yaml", f"the source {opts.source!r}")
    src = (_by_bundle_rules(state, opts.source, opts.namespace, "source", "pod")
           if opts.source is not None and opts.selector is None else None) \
        or K.resolve_pod(kube, state, opts.source, opts.namespace, opts.selector,
                         what="source pod", notes=notes)
    K._require_running(src, "source pod")
    query = {"kind": opts.kind, "source": f"{src['metadata']['namespace']}/"
                                          f"{src['metadata']['name']}"}
    touched = [K.pod_node(src)]
    pods = [src]
    if opts.destination is not None:
        kind = {"pod-to-svc": "service", "pod-to-pod": "pod"}.get(opts.kind or "")
        if kind == "service":
            need("services.yaml", f"the Service {opts.destination!r}")
            dkind, dst = "service", (
                _by_bundle_rules(state, opts.destination, opts.namespace, "destination",
                                 "service")
                or K.resolve_service(state, opts.destination, opts.namespace))
        elif kind == "pod":
            dkind, dst = "pod", (
                _by_bundle_rules(state, opts.destination, opts.namespace, "destination", "pod")
                or K.resolve_pod(kube, state, opts.destination, opts.namespace,
                                 what="destination pod", notes=notes))
        else:
            need("services.yaml", f"the destination {opts.destination!r}")
            dkind, dst = K.resolve_destination(state, opts.destination, opts.namespace)
        dns, dname = dst["metadata"]["namespace"], dst["metadata"]["name"]
        query["destination"] = f"{dns}/{dname}"
        query["destination_kind"] = dkind
        query["kind"] = opts.kind or ("pod-to-svc" if dkind == "service" else "pod-to-pod")
        if dkind == "service":
            port = K.resolve_port(dst, opts.port)
            query["port"] = port.port
            if port.name:
                query["port_name"] = port.name
            eps = state.endpoints(dns, dname)
            if f"k8s/{K.CORE_RESOURCES[2].file}" in missing:
                # the EndpointSlices were not collected: the Service's selector over the pods
                # says which nodes its endpoints are on (the trace reads them off the datapath)
                eps = state.selected_pods(dst)
                warn(f"traceflow: warning: EndpointSlices were not collected: the nodes of "
                     f"service {dns}/{dname}'s endpoints are taken from its selector "
                     f"({len(eps)} Running pods)")
            elif not eps:
                warn(f"traceflow: warning: service {dns}/{dname} has no endpoints: the trace "
                     "will end at the load balancer")
            query["endpoints"] = [e[0] for e in eps]
            for _addr, pod, node in eps:
                if node:
                    touched.append(node)
                if pod:
                    p = state.pod(*pod.split("/", 1))
                    if p is not None and K.pod_phase(p) == "Running":
                        pods.append(p)
        else:
            touched.append(K.pod_node(dst))
            pods.append(dst)
    touched = sorted({t for t in touched if t})
    query["nodes"] = touched
    seen, uniq = set(), []
    for p in pods:
        key = (p["metadata"]["namespace"], p["metadata"]["name"])
        if key not in seen:
            seen.add(key)
            uniq.append(p)
    return query, touched, uniq


