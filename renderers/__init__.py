"""Renderers: pure functions of the trace model (``traceflow.model.trace``) to text.

- ``render_json`` / ``trace_to_dict``: the v1 JSON contract (docs/trace-json-v1.md).
- ``render_yaml``: the same document as YAML.
- ``render_text`` (``renderers.text``): the default view, summary first, one line per hop;
  ``verbose`` every fact. ``render_hop`` (``renderers.hopstory``): one hop's full story.
- ``render_table``: the full Rich table (``--wide``); ``make_console`` gives a themed console.
- ``render_html`` (``renderers.html_out``) and ``render_dot`` (``renderers.diagram``): the report
  page and its diagram; imported only when asked for.

``renderers.walk`` holds what these views share (hop numbers, where a path stopped, short
forms); ``renderers.textfit`` escapes bundle text and fits it to a width.
"""

from renderers.json_out import SCHEMA, render_json, trace_to_dict
from renderers.table import make_console, render_table
from renderers.theme import THEME, VERDICT_STYLES
from renderers.yaml_out import render_yaml

__all__ = ["SCHEMA", "THEME", "VERDICT_STYLES", "make_console", "render_json", "render_table",
           "render_yaml", "trace_to_dict"]
