"""Renderers: pure functions of the trace model (``traceflow.trace``) to text.

- ``render_json`` / ``trace_to_dict``: the v1 JSON contract (docs/trace-json-v1.md).
- ``render_yaml``: the same document as YAML.
- ``render_table``: Rich tables for a person; ``make_console`` gives a console with the theme.
"""

from renderers.json_out import SCHEMA, render_json, trace_to_dict
from renderers.table import make_console, render_table
from renderers.theme import THEME, VERDICT_STYLES
from renderers.yaml_out import render_yaml

__all__ = ["SCHEMA", "THEME", "VERDICT_STYLES", "make_console", "render_json", "render_table",
           "render_yaml", "trace_to_dict"]
