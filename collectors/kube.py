"""Kubernetes API access for live collection, with the official client (imported lazily).

Credentials come from ``--kubeconfig`` / ``$KUBECONFIG`` / ``~/.kube/config`` (contexts,
client certificates, bearer tokens and exec auth plugins, as the client supports them), or
from the in-cluster service account when there is no kubeconfig. Every call is read-only,
bounded by a timeout and returns raw JSON (``_preload_content=False``: no model classes, so
fields the client does not know survive and large lists stay fast).

The query (`frontend`, `deploy/frontend`, `-l app=web`, `svc/backendsvc`, ports by name or
number) is resolved here, against what the API returns; errors are ``InputError`` (exit 2)
with close names suggested, API failures are ``CollectionError`` (exit 3).
"""

from __future__ import annotations

import difflib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

# what goes into a bundle: an allow-list, applied to every list page as it arrives
from traceflow.bundle.sanitize import sanitize
from traceflow.model.errors import CollectionError, InputError

# ---- names ------------------------------------------------------------------------------

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(rf"^{_LABEL}$")
_DNS1123_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

_NAME_RULES = {   # kind -> (pattern, max length, what it is)
    "namespace": (_DNS1123_LABEL, 63, "a DNS-1123 label"),
    "pod": (_DNS1123_SUBDOMAIN, 253, "a DNS-1123 subdomain"),
    "node": (_DNS1123_SUBDOMAIN, 253, "a DNS-1123 subdomain"),
    "deployment": (_DNS1123_SUBDOMAIN, 253, "a DNS-1123 subdomain"),
    "service": (_DNS1035_LABEL, 63, "a DNS-1035 label"),
    "container": (_DNS1123_LABEL, 63, "a DNS-1123 label"),
}


def validate_name(kind: str, value: str, where: str | None = None) -> str:
    """The name, or InputError: names go into API paths and bundle file paths, so anything
    that is not a valid Kubernetes name (``..``, ``/``, spaces, upper case) stops here."""
    rx, limit, what = _NAME_RULES[kind]
    if not value or len(value) > limit or not rx.match(value):
        raise InputError(f"invalid {kind} name {value!r}: must be {what} (lower-case letters, "
                         f"digits and '-', at most {limit} characters)", where or f"--{kind}")
    return value


# ---- selectors --------------------------------------------------------------------------

def selector_string(selector: dict) -> str:
    """A LabelSelector object as the API's ``labelSelector`` query string."""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for e in selector.get("matchExpressions") or []:
        op, key, values = e.get("operator"), e.get("key"), e.get("values") or []
        if op == "In":
            parts.append(f"{key} in ({','.join(values)})")
        elif op == "NotIn":
            parts.append(f"{key} notin ({','.join(values)})")
        elif op == "Exists":
            parts.append(key)
        elif op == "DoesNotExist":
            parts.append(f"!{key}")
        else:
            raise InputError(f"unsupported selector operator {op!r}", "deployment selector")
    return ",".join(parts)


# ---- the client -------------------------------------------------------------------------

@dataclass(frozen=True)
class Resource:
    """One kind traceflow lists: which client method, and under which bundle file name."""

    file: str                 # k8s/<file>
    api_version: str          # v1, discovery.k8s.io/v1, ...
    kind: str
    plural: str
    api: str = ""             # generated client class and method (built-in kinds)
    method: str = ""
    custom: bool = False      # a CRD: 404 means "not installed", fine


CORE_RESOURCES = (
    Resource("pods.yaml", "v1", "Pod", "pods", "CoreV1Api", "list_pod_for_all_namespaces"),
    Resource("services.yaml", "v1", "Service", "services", "CoreV1Api",
             "list_service_for_all_namespaces"),
    Resource("endpointslices.yaml", "discovery.k8s.io/v1", "EndpointSlice", "endpointslices",
             "DiscoveryV1Api", "list_endpoint_slice_for_all_namespaces"),
    Resource("nodes.yaml", "v1", "Node", "nodes", "CoreV1Api", "list_node"),
    Resource("networkpolicies.yaml", "networking.k8s.io/v1", "NetworkPolicy", "networkpolicies",
             "NetworkingV1Api", "list_network_policy_for_all_namespaces"),
)

# CNI policy CRDs: the first version the API serves is used; all of them may be absent.
CRD_RESOURCES = (
    ("clusternetworkpolicies.yaml", ("crd.antrea.io/v1beta1", "crd.antrea.io/v1alpha1"),
     "ClusterNetworkPolicy", "clusternetworkpolicies"),
    ("antreanetworkpolicies.yaml", ("crd.antrea.io/v1beta1", "crd.antrea.io/v1alpha1"),
     "NetworkPolicy", "networkpolicies"),
    # Antrea Egress: which Pods leave with which SNAT IP, and the node holding it
    ("egresses.yaml", ("crd.antrea.io/v1beta1", "crd.antrea.io/v1alpha2"), "Egress",
     "egresses"),
    ("ciliumnetworkpolicies.yaml", ("cilium.io/v2",), "CiliumNetworkPolicy",
     "ciliumnetworkpolicies"),
    ("ciliumclusterwidenetworkpolicies.yaml", ("cilium.io/v2",),
     "CiliumClusterwideNetworkPolicy", "ciliumclusterwidenetworkpolicies"),
)


class DeadlinePassed(CollectionError):
    """The overall deadline passed during an API call or list."""


class ApiError(CollectionError):
    def __init__(self, status: int, reason: str):
        self.status = status
        super().__init__(reason)


def _status_message(body) -> str:
    """The ``message`` of a Kubernetes Status body, or the body itself, shortened."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    try:
        doc = json.loads(body)
        if isinstance(doc, dict) and doc.get("message"):
            return str(doc["message"])
    except (TypeError, ValueError):
        pass
    return (body or "").strip()[:300]


def kubeconfig_present(kubeconfig: str | None) -> bool:
    if kubeconfig:
        return True
    env = os.environ.get("KUBECONFIG")
    if env:
        return any(Path(p).expanduser().exists() for p in env.split(os.pathsep) if p)
    return Path("~/.kube/config").expanduser().exists()


# Bounds on what one list may bring: per response (one page of 500 items is a few MB even for
# large pods) and in items; the overall deadline bounds the time.
MAX_RESPONSE = 64 << 20
MAX_LIST_ITEMS = 1_000_000


def _read_capped(resp, cap: int, what: str, deadline: float | None = None) -> bytes:
    """The response body, read in chunks: refused past ``cap`` bytes, and abandoned at the
    deadline (a socket timeout bounds each read, not a server that drips bytes)."""
    import time
    body, size = bytearray(), 0
    declared = (getattr(resp, "headers", None) or {}).get("Content-Length")
    if declared is not None and str(declared).isdigit() and int(declared) > cap:
        resp.release_conn()            # refused before a byte of it is read
        raise CollectionError(f"the API server's answer for {what} is larger than {cap} bytes "
                              f"({declared} announced): refused")
    read1 = getattr(resp, "read1", None)      # urllib3 >= 2: what one recv() brings
    pieces = (iter(lambda: read1(1 << 16), b"") if read1 is not None
              else resp.stream(1 << 12, decode_content=True))
    try:
        for chunk in pieces:
            size += len(chunk)
            if size > cap:
                raise CollectionError(f"the API server's answer for {what} is larger than "
                                      f"{cap} bytes: refused")
            if deadline is not None and time.monotonic() > deadline:
                raise DeadlinePassed(f"the overall --deadline passed while reading {what} "
                                     "from the API server (the answer was still arriving)")
            body += chunk
    finally:
        resp.release_conn()
    return body


class Kube:
    """A read-only view of one cluster. ``timeout`` bounds every API call (seconds),
    ``deadline`` (time.monotonic(), optional) the whole run."""

    def __init__(self, kubeconfig: str | None = None, context: str | None = None,
                 timeout: float = 30.0, deadline: float | None = None):
        from kubernetes import client, config
        from kubernetes.config.config_exception import ConfigException
        self.timeout = timeout
        self.deadline = deadline
        self.max_response = MAX_RESPONSE
        self.dropped: dict[str, set[str]] = {}     # bundle file -> key paths not kept
        cfg = client.Configuration()
        # the client reads $KUBECONFIG once, at import: resolve it now (a list of paths is
        # merged by the client, as kubectl does)
        kubeconfig = kubeconfig or os.environ.get("KUBECONFIG") or None
        try:
            if kubeconfig_present(kubeconfig):
                if context:
                    contexts, _ = config.list_kube_config_contexts(config_file=kubeconfig)
                    names = [c["name"] for c in contexts]
                    if context not in names:
                        close = difflib.get_close_matches(context, names, n=3)
                        raise InputError(f"context {context!r} not found in the kubeconfig"
                                         + (f"; did you mean: {', '.join(close)}?" if close
                                            else f" (it has: {', '.join(names) or 'none'})"),
                                         "--context")
                config.load_kube_config(config_file=kubeconfig, context=context,
                                        client_configuration=cfg, persist_config=False)
                self.cluster = self._cluster_name(kubeconfig, context)
            else:
                if context:
                    raise InputError("--context needs a kubeconfig, and none was found "
                                     "(--kubeconfig, $KUBECONFIG or ~/.kube/config)", "--context")
                config.load_incluster_config(client_configuration=cfg)
                self.cluster = "in-cluster"
        except ConfigException as exc:
            raise CollectionError(f"cannot load Kubernetes credentials: {exc} (pass "
                                  "--kubeconfig, set $KUBECONFIG, or run inside a cluster)") \
                from None
        except OSError as exc:
            raise CollectionError(f"cannot read the kubeconfig: {exc}") from None
        cfg.retries = 1
        self.configuration = cfg
        self.api_client = client.ApiClient(configuration=cfg)
        self.server = cfg.host

    @staticmethod
    def _cluster_name(kubeconfig, context) -> str:
        from kubernetes import config
        try:
            contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
        except Exception:  # noqa: BLE001 - only a label for the manifest
            return "unknown"
        ctx = next((c for c in contexts if c["name"] == context), None) if context else active
        return (ctx or {}).get("context", {}).get("cluster") or (ctx or {}).get("name") or "unknown"

    def new_api_client(self):
        """A separate ApiClient on the same credentials: ``kubernetes.stream.stream`` swaps
        ``api_client.call_api`` while it runs, so concurrent execs must not share one."""
        from kubernetes import client
        return client.ApiClient(configuration=self.configuration)

    def close(self) -> None:
        try:
            self.api_client.close()
        except Exception:  # noqa: BLE001 - closing pools on the way out
            pass

    # ---- raw calls -----------------------------------------------------------------------
    def _time_left(self, what: str) -> float:
        """Seconds this call may take: the per-call timeout, capped by the overall deadline.
        CollectionError when the deadline has passed."""
        import time
        if self.deadline is None:
            return self.timeout
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise DeadlinePassed(f"the overall --deadline passed while reading {what} from "
                                 "the API server")
        return max(0.1, min(self.timeout, left))

    def _call(self, api: str, method: str, what: str, *args, **kwargs) -> dict:
        """One generated-client call with the raw JSON kept (``_preload_content=False``),
        bounded in time (``_time_left``) and size (MAX_RESPONSE bytes, read in chunks).
        ApiError on an HTTP error status, CollectionError when the server cannot be reached."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException
        from urllib3.exceptions import HTTPError
        fn = getattr(getattr(client, api)(self.api_client), method)
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        try:
            resp = fn(*args, _preload_content=False, _request_timeout=self._time_left(what),
                      **kwargs)
            data = _read_capped(resp, self.max_response, what, self.deadline)
        except ApiException as exc:
            raise self._api_error(exc, what) from None
        except (HTTPError, OSError) as exc:
            from urllib3.exceptions import ProtocolError, ReadTimeoutError
            inner = getattr(exc, "reason", None)      # MaxRetryError wraps the last failure
            inner = inner if isinstance(inner, BaseException) else exc
            if isinstance(inner, ReadTimeoutError) or isinstance(exc, ReadTimeoutError):
                raise CollectionError(f"the API server did not answer {what} in time (it "
                                      f"stalled): {_short(exc)}") from None
            if isinstance(inner, ProtocolError) or isinstance(exc, ProtocolError) \
                    or "IncompleteRead" in repr(exc):
                raise CollectionError(f"the API server's answer for {what} was cut off: "
                                      f"{_short(exc)}") from None
            raise CollectionError(f"cannot reach the Kubernetes API server {self.server} "
                                  f"({what}): {_short(exc)}") from None
        try:
            return json.loads(data)
        except ValueError:
            raise CollectionError(f"the API server returned something that is not JSON for "
                                  f"{what}") from None

    def _api_error(self, exc, what: str) -> ApiError:
        status = getattr(exc, "status", 0) or 0
        msg = _status_message(getattr(exc, "body", None) or getattr(exc, "reason", "") or "")
        if status == 401:
            text = f"unauthorized reading {what}: the credentials were rejected ({msg})"
        elif status == 403:
            text = (f"forbidden reading {what}: {msg} (grant the read-only ClusterRole in "
                    "deploy/rbac.yaml)")
        elif status == 404:
            text = f"{what} not found ({msg})"
        else:
            text = f"the API server answered {status} for {what}: {msg}"
        return ApiError(status, text)

    def _list(self, api: str, method: str, what: str, kind: str, *args, **kwargs) -> list[dict]:
        """Every item of a list, following ``continue`` tokens (500 per page), each item cut
        down by ``sanitize`` as its page arrives. Bounded: the overall deadline (a server that
        keeps sending ``continue`` tokens is stopped there), MAX_LIST_ITEMS items, and a
        repeated token is an error at once."""
        items, cont, pages, seen = [], None, 0, set()
        while True:
            try:
                page = self._call(api, method, what, *args, limit=500, _continue=cont,
                                  **kwargs)
            except DeadlinePassed:
                if not pages:
                    raise
                raise DeadlinePassed(self._endless(what, pages, len(items))) from None
            pages += 1
            got = page.get("items") or []
            if not isinstance(got, list):
                raise CollectionError(f"the API server returned a list of {what} whose items "
                                      "are not a list")
            items.extend(sanitize(i, kind) for i in got if isinstance(i, dict))
            cont = (page.get("metadata") or {}).get("continue")
            if not cont:
                return items
            if cont in seen or len(items) > MAX_LIST_ITEMS:
                raise CollectionError(f"listing {what} does not end: the API server keeps "
                                      f"sending continue tokens ({pages} pages, {len(items)} "
                                      "items read)")
            seen.add(cont)
            if self.deadline is not None and __import__("time").monotonic() >= self.deadline:
                raise DeadlinePassed(self._endless(what, pages, len(items)))

    @staticmethod
    def _endless(what: str, pages: int, items: int) -> str:
        return (f"the overall --deadline passed while listing {what}: the API server was still "
                f"sending continue tokens after {pages} pages ({items} items)")

    # ---- what traceflow reads ----------------------------------------------------------------
    def list_kind(self, res: "Resource") -> list[dict]:
        if res.custom:
            group, version = res.api_version.split("/")
            items = self._list("CustomObjectsApi", "list_cluster_custom_object",
                               f"{res.plural}.{group}", res.kind, group, version, res.plural)
        else:
            items = self._list(res.api, res.method, f"{res.plural} ({res.api_version})",
                               res.kind)
        return [_with_type(i, res.api_version, res.kind) for i in items]

    def list_pods(self, namespace: str, selector: str | None = None) -> list[dict]:
        validate_name("namespace", namespace, "--namespace")
        items = self._list("CoreV1Api", "list_namespaced_pod", f"pods in {namespace}", "Pod",
                           namespace, label_selector=selector)
        return [_with_type(i, "v1", "Pod") for i in items]

    def get_deployment(self, namespace: str, name: str) -> dict:
        """Only its selector is kept (the source pod is one of its pods)."""
        validate_name("namespace", namespace, "--namespace")
        validate_name("deployment", name, "deploy/NAME")
        dep = self._call("AppsV1Api", "read_namespaced_deployment",
                         f"deployment {namespace}/{name}", name, namespace)
        return {"metadata": {"name": name, "namespace": namespace},
                "spec": {"selector": ((dep.get("spec") or {}).get("selector") or {})}}

    def get_config_map(self, namespace: str, name: str,
                       keys: frozenset | None = None) -> tuple[dict, list[str]]:
        """One named ConfigMap (cilium-config), cut down to its name and the data keys in
        ``keys`` (collectors/allowlist.py): (object, the names of the keys dropped)."""
        from collectors.allowlist import config_map
        validate_name("namespace", namespace)
        validate_name("pod", name)     # a DNS-1123 subdomain, as ConfigMap names are
        cm = self._call("CoreV1Api", "read_namespaced_config_map",
                        f"configmap {namespace}/{name}", name, namespace)
        if not isinstance(cm, dict):
            raise CollectionError(f"the API server returned a configmap {namespace}/{name} "
                                  "that is not an object")
        kept, dropped = config_map(cm, keys or frozenset())
        return _with_type(kept, "v1", "ConfigMap"), dropped

    def list_crds_status(self) -> tuple[dict[str, list[dict]], list]:
        """(file -> items for every CNI policy CRD the API serves, [(file, kind, error)] for
        those it does not: 404 = not installed, 403 = forbidden, anything else). Each object
        is cut down to its CNI's allow-list (collectors/allowlist.py); the key paths dropped
        are kept in ``self.dropped`` (names only)."""
        from collectors.allowlist import crd_object, crd_spec
        out, problems = {}, []
        for file, versions, kind, plural in CRD_RESOURCES:
            last = None
            for version in versions:
                res = Resource(file, version, kind, plural, custom=True)
                try:
                    items = self.list_kind(res)
                except ApiError as err:
                    last = err
                    if err.status == 404:
                        continue
                    break
                spec = crd_spec(kind, version)
                if spec is not None:
                    gone: set[str] = set()
                    items = [crd_object(i, spec, gone) for i in items]
                    if gone:
                        self.dropped.setdefault(f"k8s/{file}", set()).update(gone)
                out[file] = items
                last = None
                break
            if last is not None:
                problems.append((file, f"{plural}.{versions[0].split('/')[0]}", last))
        return out, problems


def _with_type(item: dict, api_version: str, kind: str) -> dict:
    """List items come without apiVersion/kind; `kubectl get -o yaml` adds them back."""
    out = {"apiVersion": api_version, "kind": kind}
    out.update(item)
    return out


def _short(exc: Exception) -> str:
    text = str(exc)
    m = re.search(r"\[Errno -?\d+\] ([^')\]]+)", text)
    if m:
        return m.group(1)
    return text if len(text) < 200 else text[:200] + "..."


def list_document(items: list[dict]) -> dict:
    """The `kubectl get KIND -A -o yaml` shape: a v1 List."""
    return {"apiVersion": "v1", "kind": "List", "items": items,
            "metadata": {"resourceVersion": ""}}


# ---- resolving the query ----------------------------------------------------------------

@dataclass
class ClusterState:
    """What the API returned, by bundle file name (k8s/<file> -> items)."""

    objects: dict[str, list[dict]] = field(default_factory=dict)

    @property
    def pods(self) -> list[dict]:
        return self.objects.get("pods.yaml", [])

    @property
    def services(self) -> list[dict]:
        return self.objects.get("services.yaml", [])

    @property
    def nodes(self) -> list[dict]:
        return self.objects.get("nodes.yaml", [])

    def node_names(self) -> list[str]:
        return sorted(n["metadata"]["name"] for n in self.nodes)

    def node_ip(self, name: str) -> str | None:
        for n in self.nodes:
            if n["metadata"]["name"] == name:
                for a in (n.get("status") or {}).get("addresses") or []:
                    if a.get("type") == "InternalIP":
                        return a.get("address")
        return None

    def pod(self, namespace: str, name: str) -> dict | None:
        return next((p for p in self.pods if _ns(p) == namespace and _name(p) == name), None)

    def selected_pods(self, svc: dict) -> list[tuple[str, str | None, str | None]]:
        """(IP, "ns/name", node) of the Running pods a Service's selector selects: its
        endpoints when the EndpointSlices could not be read."""
        sel = (svc.get("spec") or {}).get("selector") or {}
        if not isinstance(sel, dict) or not sel:
            return []
        out = []
        for p in self.pods_in(_ns(svc)):
            labels = (p.get("metadata") or {}).get("labels") or {}
            if pod_phase(p) == "Running" and all(labels.get(k) == v for k, v in sel.items()):
                out.append(((p.get("status") or {}).get("podIP"), f"{_ns(p)}/{_name(p)}",
                            pod_node(p)))
        return out

    def pods_in(self, namespace: str) -> list[dict]:
        return [p for p in self.pods if _ns(p) == namespace]

    def service(self, namespace: str, name: str) -> dict | None:
        return next((s for s in self.services if _ns(s) == namespace and _name(s) == name), None)

    def endpoints(self, namespace: str, service: str) -> list[tuple[str, str | None, str | None]]:
        """(address, pod "ns/name" or None, node or None) of a Service's EndpointSlices."""
        out = []
        for s in self.objects.get("endpointslices.yaml", []):
            if _ns(s) != namespace or (s["metadata"].get("labels") or {}).get(
                    "kubernetes.io/service-name") != service:
                continue
            for ep in s.get("endpoints") or []:
                ref = ep.get("targetRef") or {}
                pod = (f"{ref.get('namespace', namespace)}/{ref['name']}"
                       if ref.get("kind", "Pod") == "Pod" and ref.get("name") else None)
                node = ep.get("nodeName")
                if node is None and pod:
                    p = self.pod(*pod.split("/", 1))
                    node = (p or {}).get("spec", {}).get("nodeName")
                for addr in ep.get("addresses") or []:
                    out.append((addr, pod, node))
        return out


def _ns(obj: dict) -> str:
    return (obj.get("metadata") or {}).get("namespace", "default")


def _name(obj: dict) -> str:
    return (obj.get("metadata") or {}).get("name", "")


def pod_phase(pod: dict) -> str:
    return (pod.get("status") or {}).get("phase", "Unknown")


def pod_node(pod: dict) -> str | None:
    return (pod.get("spec") or {}).get("nodeName")


def _suggest(kind: str, ns: str, name: str, candidates: list[str]) -> str:
    msg = f"{kind} {ns}/{name} not found"
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.5)
    if close:
        msg += f"; did you mean: {', '.join(close)}?"
    return msg


def split_ref(ref: str, namespace: str, prefixes: tuple[str, ...]) -> tuple[str, str]:
    """``ns/name``, ``name`` or ``<prefix>/name`` -> (namespace, name)."""
    for p in prefixes:
        if ref.startswith(p + "/"):
            ref = ref[len(p) + 1:]
            break
    if "/" in ref:
        ns, name = ref.split("/", 1)
        return ns, name
    return namespace, ref


def _require_running(pod: dict, what: str) -> dict:
    phase = pod_phase(pod)
    key = f"{_ns(pod)}/{_name(pod)}"
    where = "DESTINATION" if what.startswith("destination") else "SOURCE"
    if phase != "Running":
        raise InputError(f"{what} {key} is not Running (phase {phase})", where)
    if not (pod.get("status") or {}).get("podIP"):
        raise InputError(f"{what} {key} has no IP yet", where)
    return pod


def resolve_pod(kube: Kube | None, state: ClusterState, ref: str | None, namespace: str,
                selector: str | None = None, what: str = "pod",
                notes: list | None = None) -> dict:
    """A pod from ``name``, ``ns/name``, ``pod/name``, ``deploy/name`` (its first Running pod)
    or a label selector; must be Running. InputError with close names otherwise."""
    notes = notes if notes is not None else []
    where = "DESTINATION" if what.startswith("destination") else "SOURCE"
    validate_name("namespace", namespace, "--namespace")
    if selector:
        if kube is None:
            raise InputError("a label selector needs the API server", "-l")
        pods = sorted(kube.list_pods(namespace, selector), key=_name)
        running = [p for p in pods if pod_phase(p) == "Running"]
        if not pods:
            raise InputError(f"no pod in namespace {namespace} matches -l {selector}", "-l")
        if not running:
            raise InputError(f"no Running pod matches -l {selector} (" + ", ".join(
                f"{_name(p)}: {pod_phase(p)}" for p in pods[:5]) + ")", "-l")
        if len(running) > 1:
            raise InputError(f"-l {selector} is ambiguous: {len(running)} Running pods match ("
                             + ", ".join(_name(p) for p in running[:8])
                             + (", ..." if len(running) > 8 else "")
                             + "); narrow the selector or name one pod", "-l")
        return _require_running(running[0], what)
    if ref is None:
        raise InputError(f"no {what} given", where)
    for prefix in ("deploy", "deployment", "deployments"):
        if ref.startswith(prefix + "/"):
            ns, name = split_ref(ref, namespace, (prefix,))
            validate_name("namespace", ns, where)
            validate_name("deployment", name, where)
            if kube is None:
                raise InputError("deploy/NAME needs the API server", where)
            try:
                dep = kube.get_deployment(ns, name)
            except ApiError as err:
                if err.status == 404:
                    raise InputError(f"deployment {ns}/{name} not found", where) from None
                raise
            sel = selector_string((dep.get("spec") or {}).get("selector") or {})
            if not sel:
                raise InputError(f"deployment {ns}/{name} has an empty selector", where)
            pods = sorted(kube.list_pods(ns, sel), key=lambda p: (
                (p.get("metadata") or {}).get("creationTimestamp") or "", _name(p)))
            running = [p for p in pods if pod_phase(p) == "Running"]
            if not running:
                raise InputError(f"deployment {ns}/{name} has no Running pod"
                                 + (" (" + ", ".join(f"{_name(p)}: {pod_phase(p)}"
                                                     for p in pods[:5]) + ")" if pods else ""),
                                 where)
            notes.append(f"deploy/{name}: using its first Running pod {_name(running[0])}"
                         + (f" (of {len(running)})" if len(running) > 1 else ""))
            return _require_running(running[0], what)
    ns, name = split_ref(ref, namespace, ("pod", "pods", "po"))
    validate_name("namespace", ns, where)
    validate_name("pod", name, where)
    pod = state.pod(ns, name)
    if pod is None:
        # a Deployment's pods are NAME-<hash>-<id>: a unique prefix match is a convenience
        prefixed = [p for p in state.pods_in(ns) if _name(p).startswith(name + "-")]
        running = [p for p in prefixed if pod_phase(p) == "Running"]
        if len(running) == 1:
            notes.append(f"{what} {name!r}: using pod {_name(running[0])}")
            return _require_running(running[0], what)
        if len(running) > 1:
            raise InputError(f"{what} {ns}/{name} is ambiguous: " + ", ".join(
                _name(p) for p in running[:8]) + f" match; name one, or use deploy/{name}", where)
        raise InputError(_suggest(what, ns, name, [_name(p) for p in state.pods_in(ns)]), where)
    return _require_running(pod, what)


@dataclass(frozen=True)
class ResolvedPort:
    name: str
    port: int
    protocol: str


def resolve_service(state: ClusterState, ref: str, namespace: str) -> dict:
    ns, name = split_ref(ref, namespace, ("svc", "service", "services"))
    validate_name("namespace", ns, "SERVICE")
    validate_name("service", name, "SERVICE")
    svc = state.service(ns, name)
    if svc is None:
        raise InputError(_suggest("service", ns, name,
                                  [_name(s) for s in state.services if _ns(s) == ns]), "SERVICE")
    return svc


def resolve_port(svc: dict, port: str | None) -> ResolvedPort:
    key = f"{_ns(svc)}/{_name(svc)}"
    ports = (svc.get("spec") or {}).get("ports") or []
    if not ports:
        raise InputError(f"service {key} has no ports", "--port")
    as_res = [ResolvedPort(p.get("name") or "", int(p.get("port", 0)), p.get("protocol", "TCP"))
              for p in ports]
    if port is None:
        if len(as_res) > 1:
            raise InputError(f"service {key} has several ports (" + ", ".join(
                f"{p.name or p.port}/{p.protocol}" for p in as_res) + "): choose one with --port",
                "--port")
        return as_res[0]
    for p in as_res:
        if str(p.port) == str(port) or (p.name and p.name == port):
            return p
    names = [p.name for p in as_res if p.name]
    close = difflib.get_close_matches(str(port), names, n=2)
    raise InputError(f"service {key} has no port {port!r} (it has " + ", ".join(
        f"{p.name + '=' if p.name else ''}{p.port}/{p.protocol}" for p in as_res) + ")"
        + (f"; did you mean {close[0]}?" if close else ""), "--port")


def resolve_destination(state: ClusterState, ref: str, namespace: str) -> tuple[str, dict]:
    """('service', svc) or ('pod', pod) for a bare destination name; ambiguous when both."""
    if ref.startswith(("svc/", "service/", "services/")):
        return "service", resolve_service(state, ref, namespace)
    if ref.startswith(("pod/", "pods/", "po/")):
        return "pod", resolve_pod(None, state, ref, namespace, what="destination pod")
    ns, name = split_ref(ref, namespace, ())
    svc = state.service(ns, name)
    pod = state.pod(ns, name)
    if svc and pod:
        raise InputError(f"{ns}/{name} is both a service and a pod: write svc/{name} or "
                         f"pod/{name}", "DESTINATION")
    if svc:
        return "service", svc
    if pod:
        return "pod", _require_running(pod, "destination pod")
    cands = [_name(s) for s in state.services if _ns(s) == ns] + \
        [_name(p) for p in state.pods_in(ns)]
    raise InputError(_suggest("service or pod", ns, name, cands), "DESTINATION")
