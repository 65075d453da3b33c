"""The pieces of tools/generate_kube_proxy.py: the synthetic cluster and how kube-proxy,
the node and kubectl render it (one module per output)."""
