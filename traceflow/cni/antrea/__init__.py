"""Antrea: its conventions (conventions.py: table names, register and mark meanings per
version, gateway and tunnel ports) and its Datapath (datapath.py: the OVS bridge)."""
