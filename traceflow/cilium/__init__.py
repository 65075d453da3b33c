"""Cilium: parsers of the agent's `cilium-dbg` outputs (the maps its BPF programs consult)."""
