"""Cilium: its conventions and one node's Cilium inputs (node.py), its Datapath (datapath.py:
the BPF programs at their hooks), service load balancing (lb.py) and policy (policy.py)."""
