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

# imported when first asked for: ``-o json`` never loads Rich (renderers.table, theme)
_WHERE = {"SCHEMA": "json_out", "render_json": "json_out", "trace_to_dict": "json_out",
          "make_console": "table", "render_table": "table", "THEME": "theme",
          "VERDICT_STYLES": "theme", "render_yaml": "yaml_out"}

__all__ = ["SCHEMA", "THEME", "VERDICT_STYLES", "make_console", "render_json", "render_table",
           "render_yaml", "trace_to_dict"]


def __getattr__(name: str):
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'renderers' has no attribute {name!r}")
    return getattr(__import__(f"renderers.{where}", fromlist=[name]), name)
