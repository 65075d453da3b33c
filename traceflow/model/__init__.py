"""The shared vocabulary at the bottom of the pipeline: located errors and exit codes
(errors.py), the packet (packet.py), conntrack entries (conntrack.py), the trace model the
renderers read (trace.py) and the no-cyclic-GC helper for building big models (lowgc.py).
Nothing here imports anything else of traceflow."""
