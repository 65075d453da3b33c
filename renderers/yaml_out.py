"""YAML output: the same document as JSON v1 (``trace_to_dict``), keys in the same order."""

from __future__ import annotations

import yaml

from renderers.json_out import trace_to_dict
from traceflow.model.trace import Trace


def render_yaml(trace: Trace) -> str:
    return yaml.safe_dump(trace_to_dict(trace), sort_keys=False, default_flow_style=False,
                          allow_unicode=True, width=1_000_000)
