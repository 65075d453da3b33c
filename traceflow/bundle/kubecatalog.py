"""A bundle's Kubernetes objects, found by key without parsing the rest of the file.

Why: a 20,000-Service bundle holds ~60 MB of ``kubectl get -o yaml``; parsing all of it takes
seconds even with libyaml, while a trace needs one Service, its EndpointSlices and a handful of
pods. So a file is first *located*: one pass of C-speed regular expressions finds where each
item of the List starts (``- `` at column 0 under ``items:``, as kubectl and PyYAML write a
List) and reads the few keys lookups use (``metadata.name``, ``metadata.namespace``,
``status.podIP``, ``spec.clusterIP``, the ``kubernetes.io/service-name`` label) from the lines
at their exact indentation. Only the items a lookup returns are parsed (libyaml), checked
against the file's shape (traceflow.bundle.validate) and turned into objects.

The keys only *narrow* the search; they never decide it. Every parsed item is compared with
the key it was found by, and an item whose keys cannot be read with certainty (a key written
twice, quoted with escapes, continued on the next line, a section in flow style) is "unkeyed":
a candidate for every lookup, parsed once. A file that is not a plain block-style List (several
documents, tabs in the indentation, anchors, no ``items:``) or an item that does not parse on
its own falls back to parsing the whole file as before, which also gives the located error
for text that is not YAML. ``k8s/<kind>.jsonl`` is located the same way, one object a line.
"""

from __future__ import annotations

import json
import re

from traceflow.model.errors import InputError, excerpt

UNKEYED = object()        # a key that could not be read with certainty
LIST_NAME = "[].name"     # a path's last step: ``name`` of the list's only entry

# the keys a lookup can ask for, per file: (section, key) at indentation 4, or
# (section, parent, key) at indentation 6
KEYS = {
    "k8s/pods.yaml": {"name": ("metadata", "name"), "namespace": ("metadata", "namespace"),
                      "ip": ("status", "podIP"),
                      # the name of the pod's one owner (a ReplicaSet for a Deployment's pods)
                      "owner": ("metadata", "ownerReferences", LIST_NAME)},
    "k8s/services.yaml": {"name": ("metadata", "name"), "namespace": ("metadata", "namespace"),
                          "ip": ("spec", "clusterIP")},
    "k8s/endpointslices.yaml": {"namespace": ("metadata", "namespace"),
                                "service": ("metadata", "labels",
                                            "kubernetes.io/service-name")},
    "k8s/endpoints.yaml": {"name": ("metadata", "name"), "namespace": ("metadata", "namespace")},
}

_ITEM = re.compile(r"^-(?: |$)", re.M)
_TOP = re.compile(r"^(?!- |-$|#|\s|$)[^\n]*", re.M)   # a column-0 line that is no item
# the lines keys are read from: every key at indentation 2 (it opens a section), and every
# line at indentation 4 and 6 (one pattern, C speed; the loop below only looks at sections
# with wanted keys)
_LINE = re.compile(r"^(?:  |    |      )(?! )[^\n]*", re.M)
_PLAIN_KEY = re.compile(r"^([A-Za-z0-9_][A-Za-z0-9_./-]*):(?: (.*))?$")
_SIMPLE_VALUE = re.compile(r"^[A-Za-z0-9_.:/-][^\s#'\"]*$")


class Unchunkable(Exception):
    """The file is not a plain block-style List: it is parsed whole."""


def _value(raw: str | None):
    """A scalar written on its key's line, or UNKEYED when YAML might read it otherwise."""
    if raw is None:
        return UNKEYED
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] == '"' and "\\" not in raw and '"' not in raw[1:-1]:
        return raw[1:-1]
    if len(raw) >= 2 and raw[0] == raw[-1] == "'" and "'" not in raw[1:-1]:
        return raw[1:-1]
    if _SIMPLE_VALUE.match(raw) and not raw.isdigit():
        return raw
    return UNKEYED


def scan_yaml(text: str, name: str) -> tuple[list[tuple[int, int, int]], list[dict], str]:
    """(items as (start, end, line), each item's keys, the List without its items).
    Raises Unchunkable when the text is not a List this reader locates with certainty."""
    if "\t" in text or "\r" in text or text.startswith(("---", "...")) \
            or "\n---" in text or "\n..." in text:
        raise Unchunkable("tabs, CR line ends or document markers")
    m = re.search(r"^items:[ ]*$", text, re.M)
    if m is None:
        if re.search(r"^items:", text, re.M):
            raise Unchunkable("items in flow style")
        return [], [], text
    body = m.end() + 1
    top = _TOP.search(text, body)
    end = top.start() if top else len(text)
    starts = [x.start() for x in _ITEM.finditer(text, body, end)]
    gap = text[body:starts[0] if starts else end]
    if any(g.strip() and not g.lstrip().startswith("#") for g in gap.split("\n")):
        raise Unchunkable("text between items: and the first item")
    wanted = KEYS.get(name, {})
    items = []
    keys = []
    line = text.count("\n", 0, starts[0]) + 1 if starts else 0
    for i, s in enumerate(starts):
        e = starts[i + 1] if i + 1 < len(starts) else end
        items.append((s, e, line))
        if not wanted:
            keys.append({})
        elif _content_at_2(text, s, e):
            keys.append(_READERS[name](text, s, e))
        else:                                      # ``-   key:``: another indentation
            keys.append(dict.fromkeys(wanted, UNKEYED))
        line += text.count("\n", s, e)
    rest = text[:m.start()] + "items: []\n" + text[end:]
    return items, keys, rest


class _KeyReader:
    """Reads one file's wanted keys from an item's text with a few C-speed searches: the
    wanted sections' opening lines, then within each section's block (the lines indented 4
    or more below it) the wanted keys' lines. A line there that starts with a quote or
    another non-plain character, a section written twice or in flow style, a key written
    twice or continued on the next line, make the key UNKEYED."""

    def __init__(self, wanted: dict):
        self.wanted = wanted
        sections = sorted({p[0] for p in wanted.values()})
        self.paths = set(wanted.values())
        self.section = re.compile(
            r"^(?:- |  )(?:(%s):(?: *([^\n]*))|([^ \nA-Za-z0-9_#-][^\n]*))$"
            % "|".join(map(re.escape, sections)), re.M)
        self.key4 = self._key_re(4, {p[1] for p in wanted.values()})
        self.lists = {p[:2] for p in wanted.values() if p[-1] == LIST_NAME}
        subs = {p[2] for p in wanted.values() if len(p) == 3 and p[2] != LIST_NAME}
        self.key6 = self._key_re(6, subs) if subs else None

    @staticmethod
    def _key_re(depth: int, keys) -> re.Pattern:
        return re.compile(r"^ {%d}(?:(%s):(?: +([^\n]*))?|([^ \nA-Za-z0-9_#-][^\n]*))$"
                          % (depth, "|".join(map(re.escape, sorted(keys)))), re.M)

    def __call__(self, text: str, start: int, end: int) -> dict:
        got: dict = {}
        bad: set = set()
        seen: set = set()
        for sm in self.section.finditer(text, start, end):
            section = sm.group(1)
            if section is None:                     # a quoted or complex key at the top
                return dict.fromkeys(self.wanted, UNKEYED)
            if section in seen or sm.group(2):
                bad.add(section)                    # written twice, or in flow style
            seen.add(section)
            lo = sm.end() + 1
            hi = _block_end(text, lo, end, 4)
            if not _indented(text, lo, hi, 4):
                bad.add(section)
                continue
            self._read(text, lo, hi, 4, (section,), got, bad)
        out = {}
        for k, path in self.wanted.items():
            if path[0] in bad or (path[-1] != LIST_NAME and got.get(path[:2]) is UNKEYED):
                out[k] = UNKEYED
            else:
                v = got.get(path)
                out[k] = v if len(path) == 2 or v is not _BLOCK else None
        return out

    def _read(self, text, lo, hi, depth, prefix, got, bad) -> None:
        pattern = self.key4 if depth == 4 else self.key6
        for km in pattern.finditer(text, lo, hi):
            if km.group(1) is None:                 # a quoted or complex key
                if depth == 4:
                    bad.add(prefix[0])
                else:
                    got[prefix] = UNKEYED
                continue
            path = prefix + (km.group(1),)
            value = km.group(2)
            if path in got:
                got[path] = UNKEYED                 # written twice: YAML keeps the last
                continue
            if path in self.paths:
                v = _value(value)
                after = km.end() + 1
                if v is not UNKEYED and after < hi and text.startswith(" " * (depth + 1), after):
                    v = UNKEYED                     # a value continued on the next line
                got[path] = v
            elif depth == 4 and path in self.lists:       # a list of mappings: its one entry
                got[path + (LIST_NAME,)] = UNKEYED if value else _list_name(text, km.end() + 1,
                                                                             hi)
            elif depth == 4 and self.key6 is not None:    # the parent of wanted subkeys
                if value:
                    got[path] = UNKEYED             # in flow style
                    continue
                got[path] = _BLOCK
                lo6 = km.end() + 1
                hi6 = _block_end(text, lo6, hi, 6)
                if not _indented(text, lo6, hi6, 6):
                    got[path] = UNKEYED
                    continue
                self._read(text, lo6, hi6, 6, path, got, bad)


_LIST_END = re.compile(r"^(?!    - |      | *#| *$)", re.M)
_LIST_ENTRY = re.compile(r"^    -(?: |$)", re.M)
_LIST_NAME = re.compile(r"^(?:    - |      )name:(?: +([^\n]*))?$", re.M)
_ODD_KEY6 = re.compile(r"^(?:    - |      )[^ \nA-Za-z0-9_#-]", re.M)


def _list_name(text: str, lo: int, hi: int):
    """``name`` of the only entry of the block-style list at ``lo`` (entries at ``    - ``,
    their keys at indentation 6); None when the list is empty, UNKEYED when it has several
    entries or the name does not read with certainty."""
    end = _LIST_END.search(text, lo, hi)
    end = hi if end is None else end.start()
    entries = len(_LIST_ENTRY.findall(text, lo, end))
    if entries == 0:
        return None if not text[lo:end].strip() else UNKEYED
    names = list(_LIST_NAME.finditer(text, lo, end))
    if entries > 1 or len(names) != 1:
        return UNKEYED
    if _ODD_KEY6.search(text, lo, end):
        return UNKEYED                              # a quoted or complex key in the entry
    v = _value(names[0].group(1))
    after = names[0].end() + 1
    if v is not UNKEYED and after < end and text.startswith(" " * 7, after):
        return UNKEYED                              # continued on the next line
    return v


_BLOCK = object()
# the end of a block: the first line indented less than ``depth`` that is no comment or blank
_BLOCK_ENDS = {d: re.compile(r"^(?! {%d}| *#| *$)" % d, re.M) for d in (4, 6)}
_FIRST_KEY = {d: re.compile(r"^(?: *#[^\n]*\n| *\n)* {%d}(?! )" % d, re.M) for d in (4, 6)}


def _block_end(text: str, lo: int, hi: int, depth: int) -> int:
    """Where the lines indented ``depth`` or more that start at ``lo`` end."""
    m = _BLOCK_ENDS[depth].search(text, lo, hi)
    return hi if m is None else m.start()


def _indented(text: str, lo: int, hi: int, depth: int) -> bool:
    """Whether the block at ``lo`` is empty or its first key is at exactly ``depth`` (a
    writer that indents by 4 puts a section's keys at 6: then nothing is read there)."""
    return lo >= hi or _FIRST_KEY[depth].match(text, lo, hi) is not None


def _content_at_2(text: str, start: int, end: int) -> bool:
    """Whether the item's mapping starts at column 2 (``- key:``, or ``-`` then ``  key:``)."""
    if text.startswith("- ", start):
        return start + 2 < end and text[start + 2] not in " \n"
    return text.startswith("-\n  ", start) and start + 4 < end and text[start + 4] not in " \n"


_READERS = {name: _KeyReader(wanted) for name, wanted in KEYS.items()}
_WHOLE_AFTER = 256      # unparsed candidates of one lookup beyond which the file is read whole


class FileCatalog:
    """One ``k8s/*`` file's items, located, parsed on demand. ``columns[key][i]`` is item i's
    lookup key (UNKEYED where unsure, None where absent); ``get(i)`` the parsed, checked
    item."""

    def __init__(self, name: str, text: str, items: list, keys: list | dict, parse,
                 whole=None, search: "_Search | None" = None):
        self.name = name
        self.text = text
        self.search = search         # not located yet: lookups search the text (_Search)
        self.items = items           # (start, end, line)
        # key -> one value per item (a column: one list per key is lighter than a dict a row)
        self.columns: dict[str, list] = keys if isinstance(keys, dict) else {
            k: [row.get(k) for row in keys] for k in {k for row in keys for k in row}}
        self._parse = parse          # (catalog, i) -> dict
        self._parsed: dict[int, dict] = {}
        self._whole = whole          # every item, when the file had to be parsed whole
        self._by: dict[str, dict] = {}
        self._asked: dict[str, int] = {}
        self._starts: dict[int, int] = {}    # search mode: an item's offset -> its index
        self._searched: dict = {}             # search mode: value -> the items holding it

    def __len__(self) -> int:
        self.locate()
        return len(self._whole) if self._whole is not None else len(self.items)

    def line(self, i: int) -> int:
        if self._whole is not None:
            return 0
        start, end, line = self.items[i]
        return line if line is not None else self.text.count("\n", 0, start) + 1

    def locate(self) -> None:
        """Leave search mode: locate every item (one pass over the file, as yaml_catalog)."""
        if self.search is None:
            return
        parsed = {self.items[i][0]: item for i, item in self._parsed.items()}
        self.search = None
        done = yaml_catalog(self.text, self.name)
        self.items, self.columns, self._whole = done.items, done.columns, done._whole
        self._parsed, self._by, self._asked = {}, {}, {}
        if self._whole is None:
            for i, (start, _, _) in enumerate(self.items):
                if start in parsed:
                    self._parsed[i] = parsed[start]

    def file_index(self, i: int) -> int:
        """Item ``i``'s place in the file's List (search mode numbers items as found)."""
        if self.search is None:
            return i
        start = self.items[i][0]
        return sum(1 for _ in _ITEM.finditer(self.text, self.search.first, start))

    def any_item(self) -> bool:
        """Whether the file lists at least one item (without locating them all)."""
        if self.search is not None:
            return self.search.first is not None
        return len(self) > 0

    def get(self, i: int) -> dict:
        if self._whole is not None:
            return self._whole[i]
        item = self._parsed.get(i)
        if item is None:
            item = self._parsed[i] = self._parse(self, i)
        return item

    def all(self) -> list[dict]:
        return [self.get(i) for i in range(len(self))]

    def lookup(self, key: str, value) -> list[dict]:
        """The parsed items whose ``key`` may be ``value``, in file order: a superset that
        the caller narrows by the parsed values."""
        if self.search is not None:
            found = self._searched.get(value)
            if found is None:
                found = self.search.items_holding(value)
                if len(self._searched) > 4096:
                    self._searched.clear()
                self._searched[value] = found
            if found is not None:
                out = [self.get(i) for i in self._adopt(found)]
                if self.search is not None:
                    return out
                # an item did not stand alone: the file was read whole, ask it again
            else:
                self.locate()
        return self._parsed_items(lambda: self.find(key, value))

    def _adopt(self, spans: list) -> list[int]:
        """Indexes (in search mode: in order of discovery) of the items at ``spans``, in file
        order."""
        out = []
        for start, end in spans:
            i = self._starts.get(start)
            if i is None:
                i = self._starts[start] = len(self.items)
                self.items.append((start, end, None))
            out.append(i)
        return out

    def lookup_prefix(self, key: str, prefix: str) -> list[dict]:
        """The parsed items whose ``key`` may start with ``prefix`` (a superset, in file
        order)."""
        self.locate()

        def find() -> list[int]:
            column = self.columns.get(key) if self._whole is None else None
            if column is None:
                return list(range(len(self)))
            return [i for i, v in enumerate(column)
                    if v is UNKEYED or (isinstance(v, str) and v.startswith(prefix))]
        return self._parsed_items(find)

    def _parsed_items(self, find) -> list[dict]:
        """The items at the indexes ``find()`` gives, parsed; found again if reading them
        made the file switch to whole-file reading (an item that did not stand alone)."""
        while True:
            located = self._whole is None
            found = find()
            if located and len(found) > _WHOLE_AFTER and \
                    sum(i not in self._parsed for i in found) > _WHOLE_AFTER:
                # many items whose keys could not be read (a file written another way):
                # one parse of the file costs less than one per item
                self._whole = _read_whole(self)
                continue
            out = [self.get(i) for i in found]
            if (self._whole is None) == located:
                return out

    def find(self, key: str, value) -> list[int]:
        """Indexes of the items whose ``key`` may be ``value`` (a superset, in file order);
        the caller compares the parsed items."""
        self.locate()
        if self._whole is not None:
            return list(range(len(self._whole)))
        column = self.columns.get(key)
        if column is None:
            return list(range(len(self.items)))
        index = self._by.get(key)
        if index is None:
            # a scan of the column (C-speed list search) until the same key has been asked
            # for often: then a dict
            self._asked[key] = self._asked.get(key, 0) + 1
            if self._asked[key] <= 8:
                return [i for i, v in enumerate(column) if v == value or v is UNKEYED]
            index = self._by[key] = {}
            for i, v in enumerate(column):
                index.setdefault(v, []).append(i)
        hits = index.get(value, [])
        unsure = index.get(UNKEYED, [])
        return sorted(hits + unsure) if unsure else hits


def _parse_yaml_item(cat: FileCatalog, i: int) -> dict:
    from traceflow.bundle import fastyaml
    from traceflow.bundle.validate import K8S_SHAPES, _check_depth
    start, end, first_line = cat.items[i]
    if first_line is None:            # found by a search: its line counted when it is needed
        first_line = cat.line(i)
    chunk = cat.text[start:end]
    try:
        _check_depth(chunk, cat.name)     # libyaml recurses in C: bound the depth first
    except InputError:
        _check_depth(cat.text, cat.name)  # the located error
        raise
    try:
        doc = fastyaml.load(chunk)
    except Exception:           # noqa: BLE001 - anything: the whole file decides
        doc = None
    if not (isinstance(doc, list) and len(doc) == 1 and isinstance(doc[0], dict)):
        # the item does not stand alone (an alias, a split quoted value): read the file
        # whole, which gives the same objects as before or the located error
        from traceflow.bundle.validate import load_list
        if cat.search is not None:      # found by a search: its index in the file
            i = cat.file_index(i)
            cat.search, cat.items, cat._parsed, cat._starts = None, [], {}, {}
        cat._whole = load_list(cat.text, cat.name)
        return cat._whole[i] if i < len(cat._whole) else {}
    item = doc[0]
    shape = K8S_SHAPES.get(cat.name)
    found = shape(item, ("items", i)) if shape is not None else None
    if found and cat.search is not None:   # found by a search: its index in the file
        found = shape(item, ("items", cat.file_index(i)))
    if found:
        # located in the item's own text (composing a 25 MB file to find one line takes
        # seconds), as the whole-file check names it
        from traceflow.bundle.validate import _line, locate, path_text
        path, reason = found
        line = locate(chunk, (0,) + tuple(path[2:]))
        line = first_line + line - 1 if line else first_line
        raise InputError(f"{path_text(path)}: {reason}", cat.name, line,
                         excerpt(_line(cat.text, line)))
    return item


def _parse_json_item(cat: FileCatalog, i: int) -> dict:
    from traceflow.bundle.validate import K8S_SHAPES, path_text
    start, end, number = cat.items[i]
    line = cat.text[start:end]
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"invalid JSON: {exc}", cat.name, number, excerpt(line)) from None
    if not isinstance(obj, dict):
        raise InputError("expected a JSON object (one Kubernetes object a line)", cat.name,
                         number, excerpt(line))
    shape = K8S_SHAPES.get(cat.name.removesuffix(".jsonl") + ".yaml")
    if shape is not None:
        found = shape(obj, ())
        if found:
            path, reason = found
            where = path_text(path)
            raise InputError(f"{where}: {reason}" if where else reason, cat.name, number,
                             excerpt(line))
    return obj


def yaml_catalog(text: str, name: str) -> FileCatalog:
    """The catalog of one ``k8s/<kind>.yaml`` file."""
    from traceflow.bundle.validate import load_list
    try:
        items, keys, rest = scan_yaml(text, name)
        from traceflow.bundle.validate import load_yaml
        head = load_yaml(rest, name)
        if not isinstance(head, dict) or head.get("items") != []:
            raise Unchunkable("the List around the items")
    except (Unchunkable, InputError):
        whole = load_list(text, name)
        return FileCatalog(name, text, [], [], _parse_yaml_item, whole=whole)
    return FileCatalog(name, text, items, keys, _parse_yaml_item)


def jsonl_catalog(text: str, name: str, shape_of: str) -> FileCatalog:
    """The catalog of one ``k8s/<kind>.jsonl`` file: each line parsed once for its keys."""
    wanted = KEYS.get(shape_of, {})
    items, keys = [], []
    pos = 0
    number = 0
    cat = FileCatalog(name, text, items, keys, _parse_json_item)
    while pos <= len(text):
        nl = text.find("\n", pos)
        end = len(text) if nl < 0 else nl
        number += 1
        if text[pos:end].strip():
            items.append((pos, end, number))
            obj = _parse_json_item(cat, len(items) - 1)
            keys.append({k: _dig(obj, path) for k, path in wanted.items()})
        if nl < 0:
            break
        pos = nl + 1
    cat.columns = {k: [row.get(k) for row in keys] for k in wanted}
    return cat


def _dig(obj: dict, path: tuple):
    for step in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(step)
    return obj if isinstance(obj, str) or obj is None else UNKEYED


# ---- search mode: a lookup finds its items by the value's text ---------------------------------

# values a lookup may search for as they are: names and addresses, which YAML writes as they
# are (plain, or quoted without escapes) and never folds over lines
_SEARCHABLE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]*")
# what could hide a value from a search: an escape in a double-quoted scalar (the item is
# always a candidate), an alias (a candidate when its anchor's text holds the value)
_MAX_HITS = 4096        # a value met more often than this: locate the file instead
# _TOP (a column-0 line that is no item) by the newline before it: the regex engine then
# jumps from newline to newline instead of trying every position (60 MB: 10 ms, not 0.3 s)
_TOP_AFTER_NEWLINE = re.compile(r"\n(?:[^-# \n]|-(?![ \n]|$))")


class _Search:
    """A List file's items found by searching for a value's text: every item whose key is
    the value holds its text (a name or an address: written as it is, see _SEARCHABLE), so
    the items holding it are a superset of the items a lookup wants, and the caller narrows
    them by their parsed keys. An item with an escaped double-quoted scalar is a candidate
    for every lookup; one with an alias, for the values its anchor's text holds. A command
    that needs every item locates the file (FileCatalog.locate)."""

    __slots__ = ("text", "first", "end", "always", "aliased")

    def __init__(self, text: str, first: int | None, end: int):
        self.text, self.first, self.end = text, first, end
        self.always: list = []          # offsets of escaped scalars
        self.aliased: list = []         # (offset of an alias, the text of its anchor's node)

    @classmethod
    def of(cls, text: str) -> "_Search | None":
        """The search over ``text``, or None when it is not a plain block-style List of
        kubectl's shape (then it is located, or read whole, as before)."""
        if "\t" in text or "\r" in text or text.startswith(("---", "...")) \
                or "\n---" in text or "\n..." in text or "<<:" in text:
            return None
        m = re.search(r"^items:[ ]*$", text, re.M)
        if m is None:
            return None
        body = m.end() + 1
        top = _TOP_AFTER_NEWLINE.search(text, body - 1)    # as _TOP, found by its newline
        end = top.start() + 1 if top else len(text)
        first = _ITEM.search(text, body, end)
        if first is not None and (text[first.start():first.start() + 3] == "-  "
                                  or text[first.start() + 1:first.start() + 2] == "\n"):
            return None         # items written another way than kubectl's "- key:"
        gap = text[body:first.start() if first else end]
        if any(g.strip() and not g.lstrip().startswith("#") for g in gap.split("\n")):
            return None
        try:
            from traceflow.bundle.validate import load_yaml
            head = load_yaml(text[:m.start()] + "items: []\n" + text[end:], "")
        except InputError:
            return None
        if not isinstance(head, dict) or head.get("items") != []:
            return None
        self = cls(text, first.start() if first else None, end)
        # (str.find loops: these characters are rare in kubectl's output, a regex over
        # every position of 60 MB is not)
        self.always = [at for at in _offsets(text, "\\", body, end) if _in_quotes(text, at)]
        aliases = [at for at in _offsets(text, "*", body, end) if _name_at(text, at)]
        if aliases:
            anchors = {_name_at(text, at): _node_text(text, at)
                       for at in _offsets(text, "&", body, end) if _name_at(text, at)}
            for at in aliases:
                node = anchors.get(_name_at(text, at))
                if node is None or "*" in node:
                    return None         # an alias we cannot place, or one in an anchor
                self.aliased.append((at, node))
        return self

    def items_holding(self, value) -> list[tuple[int, int]] | None:
        """(start, end) of the items whose text holds ``value``, in file order; None when
        the value is not one to search for, or too common (locate the file instead)."""
        if not isinstance(value, str) or not _SEARCHABLE.fullmatch(value):
            return None
        if self.first is None:
            return []
        text, end = self.text, self.end
        spans: dict = {}
        pos = text.find(value, self.first, end)
        hits = 0
        while pos >= 0:
            hits += 1
            if hits > _MAX_HITS:
                return None
            start, stop = self._item_at(pos)
            spans[start] = stop
            pos = text.find(value, stop, end)
        for at in self.always:
            start, stop = self._item_at(at)
            spans[start] = stop
        for at, node in self.aliased:
            if value in node:
                start, stop = self._item_at(at)
                spans[start] = stop
        return sorted(spans.items())

    def _item_at(self, pos: int) -> tuple[int, int]:
        """(start, end) of the item whose text holds offset ``pos``."""
        text = self.text
        start = text.rfind("\n-", self.first - 1, pos + 1)
        while start >= 0 and text[start + 2:start + 3] not in (" ", "\n"):
            start = text.rfind("\n-", self.first - 1, start)
        start = self.first if start < self.first else start + 1
        nxt = _ITEM.search(text, pos + 1, self.end)
        return start, nxt.start() if nxt else self.end


def _offsets(text: str, char: str, start: int, end: int) -> list[int]:
    out = []
    at = text.find(char, start, end)
    while at >= 0:
        out.append(at)
        at = text.find(char, at + 1, end)
    return out


_NAME = re.compile(r"[A-Za-z0-9_-]+")


def _name_at(text: str, at: int) -> str | None:
    """The anchor or alias name after the ``&``/``*`` at ``at``, when it is one (after a
    space, a colon, a dash, a bracket or a line start), else None."""
    if at > 0 and text[at - 1] not in " \n:[,{-":
        return None
    m = _NAME.match(text, at + 1)
    return m.group(0) if m else None


def _in_quotes(text: str, at: int) -> bool:
    """Whether offset ``at`` may be inside a double-quoted scalar (a quote before it on its
    line)."""
    return text.rfind('"', text.rfind("\n", 0, at) + 1, at) >= 0


def _node_text(text: str, at: int) -> str:
    """The text of the node anchored at offset ``at``: the rest of its line and the lines
    below indented deeper than that line."""
    line_start = text.rfind("\n", 0, at) + 1
    indent = len(text[line_start:at]) - len(text[line_start:at].lstrip(" "))
    end = text.find("\n", at)
    end = len(text) if end < 0 else end
    pos = end + 1
    while pos < len(text):
        nxt = text.find("\n", pos)
        nxt = len(text) if nxt < 0 else nxt
        line = text[pos:nxt]
        if line.strip() and len(line) - len(line.lstrip(" ")) <= indent \
                and not line.lstrip(" ").startswith("- ") or \
                (line.strip() and len(line) - len(line.lstrip(" ")) < indent):
            break
        end, pos = nxt, nxt + 1
    return text[at:end]


# ---- a bundle's objects ------------------------------------------------------------------------

class Objects:
    """Every ``k8s/*`` file of a bundle, each located on first use. ``read(name)`` gives a
    file's text (None when absent). ``layouts``: files' layouts stored by the bundle index
    (file -> layout_to_json(...)), used instead of locating the file again when they fit.
    ``whole``: a function (file) -> the file's checked items stored earlier, or None."""

    def __init__(self, read, layouts: dict | None = None, whole=None, keep_whole=None):
        self._read = read
        self._layouts = layouts or {}
        self._files: dict[str, FileCatalog | None] = {}
        self._stored_whole = whole
        self._keep_whole = keep_whole      # (file, items) -> None: to store a file read whole
        self.located: dict[str, FileCatalog] = {}

    def catalog(self, name: str) -> FileCatalog | None:
        if name not in self._files:
            self._files[name] = self._locate(name)
        return self._files[name]

    def _locate(self, name: str) -> FileCatalog | None:
        text = self._read(name)
        jsonl = name.removesuffix(".yaml") + ".jsonl"
        if text is None:
            text = self._read(jsonl)
            if text is None:
                return None
            cat = _from_layout(self._layouts.get(jsonl), jsonl, text, _parse_json_item)
            if cat is None:
                cat = jsonl_catalog(text, jsonl, name)
            self.located[jsonl] = cat
            return cat
        if name not in KEYS:                       # small files: read whole
            from traceflow.bundle.validate import load_list
            return FileCatalog(name, text, [], [], _parse_yaml_item, whole=load_list(text, name))
        cat = _from_layout(self._layouts.get(name), name, text, _parse_yaml_item)
        if cat is None:
            search = _Search.of(text)
            cat = FileCatalog(name, text, [], {}, _parse_yaml_item, search=search) \
                if search is not None else yaml_catalog(text, name)
        self.located[name] = cat
        return cat

    def has_items(self, name: str) -> bool:
        cat = self.catalog(name)
        return cat is not None and cat.any_item()

    def count(self, name: str) -> int:
        cat = self.catalog(name)
        return 0 if cat is None else len(cat)

    def all(self, name: str) -> list[dict]:
        """Every checked item of the file (read whole: one parse, not one per item)."""
        cat = self.catalog(name)
        if cat is None:
            return []
        if cat._whole is None:
            stored = self._stored_whole(cat.name) if self._stored_whole else None
            if stored is not None and len(stored) == len(cat):
                cat._whole = stored
            else:
                cat._whole = _read_whole(cat)
                if self._keep_whole is not None:
                    self._keep_whole(cat.name, cat._whole)
        return cat._whole

    def lookup(self, name: str, key: str, value) -> list[dict]:
        cat = self.catalog(name)
        return [] if cat is None else cat.lookup(key, value)

    def lookup_prefix(self, name: str, key: str, prefix: str) -> list[dict]:
        cat = self.catalog(name)
        return [] if cat is None else cat.lookup_prefix(key, prefix)

    def key_rows(self, name: str, keys: tuple) -> list[tuple] | None:
        """The ``keys`` of every item of the file as read when it was located (nothing
        parsed), or None when some could not be read that way."""
        cat = self.catalog(name)
        if cat is None:
            return []
        cat.locate()
        cols = [cat.columns.get(k) for k in keys]
        if cat._whole is not None or any(c is None or UNKEYED in c for c in cols):
            return None
        return list(zip(*cols))


def _read_whole(cat: FileCatalog) -> list[dict]:
    if cat.name.endswith(".jsonl"):
        return [cat.get(i) for i in range(len(cat))]
    from traceflow.bundle.validate import load_list
    return load_list(cat.text, cat.name)


# ---- layouts as JSON (what the bundle index stores) --------------------------------------------

def layout_to_json(cat: FileCatalog) -> dict | None:
    if cat.search is not None:
        return None                                # only searched: nothing located to store
    if cat._whole is not None and not cat.items:
        return None                                # read whole: nothing located to store
    return {"size": len(cat.text), "items": [x for item in cat.items for x in item],
            "keys": {k: [False if v is UNKEYED else v for v in col]
                     for k, col in cat.columns.items()}}


def _from_layout(layout, name: str, text: str, parse) -> FileCatalog | None:
    """The catalog a stored layout describes, or None when it does not fit ``text``."""
    if not isinstance(layout, dict) or layout.get("size") != len(text):
        return None
    flat = layout.get("items")
    keys = layout.get("keys")
    if not isinstance(flat, list) or len(flat) % 3 or not isinstance(keys, dict):
        return None
    n = len(flat) // 3
    items = [(flat[3 * i], flat[3 * i + 1], flat[3 * i + 2]) for i in range(n)]
    if any(not (isinstance(s, int) and isinstance(e, int) and 0 <= s < e <= len(text))
           for s, e, _ in items):
        return None
    if name.endswith(".yaml") and any(text[s] != "-" for s, _, _ in items):
        return None                                # not where the items start
    columns = {}
    for k, col in keys.items():
        if not isinstance(col, list) or len(col) != n:
            return None
        columns[k] = [UNKEYED if v is False else v for v in col]
    return FileCatalog(name, text, items, columns, parse)
