"""traceflow: packet-path troubleshooting for Kubernetes clusters, from a snapshot (bundle)."""

__version__ = "0.1.0"
