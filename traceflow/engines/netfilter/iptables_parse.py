"""iptables-save parser: a rule's words read with the grammar (iptables_grammar.py: core
options, match modules and targets), and the reader of ``iptables-save`` [-c] output into a
``Ruleset``.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field

from traceflow.model.errors import InputError, Source
from traceflow.engines.netfilter.iptables_grammar import (  # noqa: F401 (re-exported)
    CORE_OPTIONS, Decoder, IMPLICIT_MODULES, MODULES, ModuleSpec, Opt)
from traceflow.engines.netfilter.iptables_matches import Match, ProtoMatch, UnknownMatch
from traceflow.engines.netfilter.iptables_model import (Chain, Rule, Ruleset, TABLES, TARGETS,
                                                        Table, _resolve_rule_targets,
                                                        _resolve_targets)
from traceflow.engines.netfilter.iptables_values import NotModelled, RuleSyntaxError


_WORD = re.compile(r"""(?:[^\s"'\\]+|"(?:[^"\\]|\\.)*"|'[^']*'|\\.)+""", re.S)
_PIECE = re.compile(r""""((?:[^"\\]|\\.)*)"|'([^']*)'|\\(.)|([^"'\\]+)""", re.S)
_DQ_ESCAPE = re.compile(r"""\\([\\"$`])""")


def tokenize(text: str) -> list[str]:
    """Words with POSIX shell quoting, as iptables-save writes them (``--comment "a b"``).

    Same result as ``shlex.split`` (which was 60% of the parse time). Raises ValueError on an
    unterminated quote.
    """
    if '"' not in text and "'" not in text and "\\" not in text:
        return text.split()                       # fast path: nothing quoted
    words, end = [], 0
    for found in _WORD.finditer(text):
        start, word = found.start(), found[0]
        if start > end and not text[end:start].isspace():
            raise ValueError("no closing quotation")
        if '"' in word or "'" in word or "\\" in word:
            word = "".join(_unquote(p) for p in _PIECE.finditer(word))
        words.append(word)
        end = found.end()
    if text[end:].strip():
        raise ValueError("no closing quotation")
    return words


def _unquote(piece: re.Match) -> str:
    double, single, escaped, plain = piece.groups()
    if double is not None:
        return _DQ_ESCAPE.sub(r"\1", double)
    return next(p for p in (single, escaped, plain) if p is not None)


class _Syntax(ValueError):
    """The rule does not follow the grammar: a syntax error at this line."""


@dataclass
class _Bucket:
    """Options collected for one ``-m`` module (or an unknown one) until the rule ends."""

    module: str
    spec: ModuleSpec | None
    opts: list[Opt] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)        # options not in the grammar

    def matches(self) -> list[Match]:
        if self.spec is None:
            text = " ".join(["-m", self.module] + self.unknown)
            reason = f"match module '{self.module}' is not modelled"
            return [UnknownMatch(self.module, text, reason)]
        out = self.spec.build(self.opts) if self.opts else []
        return out + [UnknownMatch(self.module, u,
                                   f"option {u} of match '{self.module}' is not modelled")
                      for u in self.unknown]


@dataclass
class _ParsedRule:
    items: list = field(default_factory=list)      # Match or _Bucket, in the order written
    target: str | None = None
    target_opts: dict[str, tuple] = field(default_factory=dict)
    target_unknown: list[str] = field(default_factory=list)
    goto: bool = False


class _Cursor:
    """Reads the words of one rule left to right."""

    def __init__(self, words: list[str]):
        self.words, self.pos = words, 0

    def more(self) -> bool:
        return self.pos < len(self.words)

    def peek(self) -> str | None:
        return self.words[self.pos] if self.more() else None

    def take(self) -> str:
        self.pos += 1
        return self.words[self.pos - 1]

    def bang(self) -> bool:
        if self.peek() == "!":
            self.pos += 1
            return True
        return False

    def args(self, option: str, count: int) -> tuple[bool, tuple[str, ...]]:
        """``count`` arguments; also accepts the old spelling ``--opt ! value``."""
        negated = count > 0 and self.bang()
        if self.pos + count > len(self.words):
            raise _Syntax(f"option {option} needs {count} argument(s): the line is truncated")
        values = tuple(self.words[self.pos:self.pos + count])
        self.pos += count
        return negated, values

    def free_args(self) -> list[str]:
        """Arguments of an option we do not know: the words up to the next option."""
        taken = []
        while self.more() and not self.peek().startswith("-"):
            taken.append(self.take())
        return taken


_STRUCTURAL = ("-m", "--match", "-j", "--jump", "-g", "--goto")


def parse_rule_words(words: list[str]) -> _ParsedRule:
    """The words after ``-A CHAIN`` -> matches and target, per the grammar tables."""
    rule, cur = _ParsedRule(), _Cursor(words)
    bucket: _Bucket | None = None
    while cur.more():
        negated = cur.bang()
        word = cur.take() if cur.more() else None
        if word is None:
            raise _Syntax("'!' at the end of the rule")
        if word in _STRUCTURAL and negated:
            raise _Syntax(f"'!' cannot negate {word}")
        if word in ("-m", "--match"):
            name = cur.args(word, 1)[1][0]
            bucket = _Bucket(name, MODULES.get(name))
            rule.items.append(bucket)
        elif word in ("-j", "--jump", "-g", "--goto"):
            _read_target(cur, word, rule)
            bucket = None
        elif word in CORE_OPTIONS:
            nargs, decode = CORE_OPTIONS[word]
            bang, args = cur.args(word, nargs)
            rule.items.append(decode(Opt(word, args, negated or bang)))
        elif word.startswith("-"):
            _read_module_option(cur, word, negated, bucket, rule)
        else:
            raise _Syntax(f"unexpected word {word!r}")
    return rule


def _read_module_option(cur: _Cursor, word: str, negated: bool, bucket: _Bucket | None,
                        rule: _ParsedRule) -> None:
    """An option belongs to the last -m module, else to the module implied by -p."""
    if word == "-c":                               # -c PKTS BYTES inside the rule (old -c form)
        cur.args(word, 2)
        return
    if bucket is not None and bucket.spec is None:
        bucket.unknown.append(" ".join((["!"] if negated else []) + [word] + cur.free_args()))
        return
    owner = bucket if bucket is not None and word in bucket.spec.options else None
    if owner is None:
        owner = _implicit_bucket(rule, word)
    if owner is None:
        text = " ".join((["!"] if negated else []) + [word] + cur.free_args())
        if bucket is None:
            raise _Syntax(f"option {word} outside any match module")
        bucket.unknown.append(text)
        return
    bang, args = cur.args(word, owner.spec.options[word])
    owner.opts.append(Opt(word, args, negated or bang))


def _implicit_bucket(rule: _ParsedRule, word: str) -> _Bucket | None:
    protos = [m.proto for m in rule.items if isinstance(m, ProtoMatch) and not m.negated]
    module = IMPLICIT_MODULES.get(protos[-1]) if protos else None
    if module is None or word not in MODULES[module].options:
        return None
    bucket = _Bucket(module, MODULES[module])
    rule.items.append(bucket)
    return bucket


def _read_target(cur: _Cursor, word: str, rule: _ParsedRule) -> None:
    if rule.target is not None:
        raise _Syntax("two targets in one rule")
    rule.target = cur.args(word, 1)[1][0]
    rule.goto = word in ("-g", "--goto")
    spec = TARGETS.get(rule.target)
    while cur.more() and cur.peek().startswith("--") and cur.peek() not in _STRUCTURAL:
        option = cur.take()
        if spec is not None and option in spec.options:
            rule.target_opts[option] = cur.args(option, spec.options[option])[1]
        else:
            rule.target_unknown.append(" ".join([option] + cur.free_args()))


def build_rule(words: list[str], source: Source, diagnostics: list[InputError]) -> Rule:
    """A Rule from the words after the chain name. Problems become diagnostics, never crashes."""
    try:
        parsed = parse_rule_words(words)
        matches = [m for item in parsed.items
                   for m in (item.matches() if isinstance(item, _Bucket) else [item])
                   if m is not None]
        target_args, unknown_target = _target_args(parsed)
    except (_Syntax, ValueError, KeyError) as exc:
        reason = str(exc) if isinstance(exc, _Syntax) else f"cannot read rule: {exc}"
        diagnostics.append(RuleSyntaxError.at(source, reason))
        return Rule([UnknownMatch("syntax", source.text.strip(), reason)], None, {}, source,
                    source.text.strip())
    rule = Rule(matches, parsed.target, target_args, source, source.text.strip(), parsed.goto,
                unknown_target)
    _note_not_modelled(rule, diagnostics)
    return rule


def _target_args(parsed: _ParsedRule) -> tuple[dict, str | None]:
    spec = TARGETS.get(parsed.target)
    if parsed.target_unknown and spec is None:
        return {}, f"target {parsed.target} is not modelled"
    if parsed.target_unknown:
        return {}, (f"option {', '.join(parsed.target_unknown)} of target {parsed.target} "
                    f"is not modelled")
    return (spec.build(parsed.target_opts) if spec else {}), None


def _note_not_modelled(rule: Rule, diagnostics: list[InputError]) -> None:
    for m in rule.matches:
        if isinstance(m, UnknownMatch):
            diagnostics.append(NotModelled.at(rule.source, m.reason))
    if rule.unknown_target:
        diagnostics.append(NotModelled.at(rule.source, rule.unknown_target))


# ---------------------------------------------------------------------------------------------
# iptables-save


_CHAIN_DECL = re.compile(r"^:(\S+)\s+(\S+)(?:\s+\[\d+:\d+\])?\s*$")
_COUNTERS = re.compile(r"^\[\d+:\d+\]\s+")


class _SaveReader:
    """Line-by-line state of ``parse_iptables_save``: the current table and its chains."""

    def __init__(self, name: str, default_table: str | None, lazy: bool = False):
        self.ruleset = Ruleset(name)
        self.lazy = lazy
        self.pending: dict[tuple[str, str], list] = {}   # (table, chain) -> its rules' line numbers
        self.default_table = default_table
        self.table: Table | None = None
        self.headerless: list[Source] = []     # lines before any *table (grep-filtered output)
        self.lines: list[str] = []             # the text's lines (lazy chains read theirs)

    def feed(self, source: Source) -> None:
        line = source.text.strip()
        if not line or line.startswith("#"):
            return
        if line.startswith("*"):
            self._table_header(source, line[1:].strip())
        elif line == "COMMIT":
            if self.table is None:
                self._error(source, "COMMIT outside a *table section")
            self.table = None
        elif line.startswith(":"):
            self._chain_decl(source, line)
        elif _COUNTERS.match(line) or line.startswith("-A"):
            self._rule(source, _COUNTERS.sub("", line, count=1))
        else:
            self._error(source, "not an iptables-save line (expected *table, :chain, -A or COMMIT)")

    def finish(self) -> Ruleset:
        if self.headerless and self.default_table is None:
            first = self.headerless[0]
            more = len(self.headerless) - 1
            self._error(first, "rule or chain outside any *table section (grep-filtered "
                        "iptables-save? pass default_table to read such lines)"
                        + (f"; {more} more such lines ignored" if more else ""))
        elif self.headerless:
            self.ruleset.caveats.append(
                f"{len(self.headerless)} lines had no *table header and were read into table "
                f"{self.default_table!r} as asked; the output looks filtered, so chains may be "
                f"incomplete and rules of other tables mixed in")
        if self.lazy:
            for (table, chain), numbers in self.pending.items():
                t = self.ruleset.tables[table]
                old = t.chains[chain]
                t.chains[chain] = LazyChain(old.name, old.policy, None, t, self.ruleset,
                                            numbers, self.lines)
        else:
            _resolve_targets(self.ruleset)
        return self.ruleset

    def _current(self, source: Source) -> Table | None:
        if self.table is not None:
            return self.table
        self.headerless.append(source)
        return self.ruleset.table(self.default_table) if self.default_table else None

    def _table_header(self, source: Source, name: str) -> None:
        if not re.fullmatch(r"[a-z_]+", name):
            self._error(source, f"bad table header {name!r}")
            return
        self.table = self.ruleset.table(name)

    def _chain_decl(self, source: Source, line: str) -> None:
        found = _CHAIN_DECL.match(line)
        if not found:
            self._error(source, "bad chain declaration (expected ':CHAIN POLICY [pkts:bytes]')")
            return
        table = self._current(source)
        if table is not None:
            policy = found[2]
            table.chain(found[1], None if policy == "-" else policy)

    def _rule(self, source: Source, line: str) -> None:
        head = line.split(None, 2)
        if head[0] != "-A" or len(head) < 2:
            self._error(source, "truncated rule: '-A' without a chain name" if head[0] == "-A"
                        else f"unsupported command {head[0]!r} (iptables-save has only -A)")
            return
        table = self._current(source)
        if table is None:
            return
        chain = table.chain(head[1])
        if self.lazy:     # the words are read when a walk first looks at the rule
            self.pending.setdefault((table.name, chain.name), []).append(source.line)
            return
        chain.rules.append(_rule_of(source, line, head[2] if len(head) > 2 else "",
                                    self.ruleset.diagnostics, self._error))

    def _error(self, source: Source, reason: str) -> None:
        self.ruleset.diagnostics.append(RuleSyntaxError.at(source, reason))


def _rule_of(source: Source, line: str, words_text: str, diagnostics: list, error) -> Rule:
    """One ``-A CHAIN ...`` line (``words_text``: what follows the chain name) as a Rule."""
    try:
        words = tokenize(words_text) if words_text else []
    except ValueError as exc:
        reason = f"cannot split rule into words: {exc}"
        error(source, reason)
        return Rule([UnknownMatch("syntax", line, reason)], None, {}, source, line)
    return build_rule(words, source, diagnostics)


# kube-proxy's per-Service rule in KUBE-SERVICES, in iptables-save's order; a line of exactly
# this shape is well formed (no syntax error can hide in it) and matches only packets to its
# cluster IP, so a walk to another address passes it without parsing it.
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_SERVICE_RULE = re.compile(
    rf"-d ({_OCTET}\.{_OCTET}\.{_OCTET}\.{_OCTET})/32 -p (?:tcp|udp|sctp)"
    r"(?: -m comment --comment (?:\"[^\"\\]*\"|[^\s\"\\]+))? -m (?:tcp|udp|sctp)"
    r" --dport (?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]"
    r"|6553[0-5]) -j [A-Z][A-Z0-9-]*")


class LazyChain(Chain):
    """A chain whose rules are parsed when a walk first looks at them: a walk through a
    ruleset of 200,000 rules reads a handful of chains, and in kube-proxy's KUBE-SERVICES
    (one rule per Service port) it parses only the rules for the packet's destination. A rule
    that cannot be read is then a located error (RuleSyntaxError, exit 2) like the eager
    parser's; targets are resolved (a chain of the table, built in, or not modelled) as each
    rule is read. ``rules`` parses them all (for code that wants the whole chain)."""

    def __init__(self, name: str, policy: str | None, lines: list | None, table: Table,
                 ruleset: Ruleset, numbers: list | None = None, text_lines: list | None = None):
        # (not the dataclass __init__: a 20k-Service ruleset makes 60,000 of these, and a
        # walk reads a handful)
        self.name, self.policy = name, policy
        # (line number, stripped text, words text) per rule; or, from a stored layout
        # (traceflow.bundle.index), the rules' line numbers in ``text_lines``
        self._lines = lines
        self._numbers = numbers
        self._text_lines = text_lines
        self._parsed: list[Rule | None] | None = None     # made when a rule is first read
        self._dst: list[str | None] | None = None
        self._by_dst: tuple | None = None
        self._table = table
        self._ruleset = ruleset

    def _entries(self) -> list:
        if self._lines is None:
            out = []
            for number in self._numbers:
                stripped = self._text_lines[number - 1].strip()
                if stripped.startswith("["):
                    stripped = _COUNTERS.sub("", stripped, count=1)
                head = stripped.split(None, 2)
                if len(head) < 2 or head[0] != "-A" or head[1] != self.name:
                    raise InputError(f"the stored layout of this file does not match line "
                                     f"{number}: remove traceflow's index cache", self._ruleset.name)
                out.append((number, stripped, head[2] if len(head) > 2 else ""))
            self._lines = out
        return self._lines

    def rule_count(self) -> int:
        return len(self._lines if self._lines is not None else self._numbers)

    def next_candidate(self, index: int, packet) -> int:
        # (KUBE-SERVICES holds one rule per Service port: a walk goes from one rule that
        # may match to the next, never past the others one by one)
        dst = packet.nw_dst
        if dst is None:
            return index
        others, by_dst = self._candidates()
        i = bisect.bisect_left(others, index)
        best = others[i] if i < len(others) else self.rule_count()
        mine = by_dst.get(dst)
        if mine:
            j = bisect.bisect_left(mine, index)
            if j < len(mine) and mine[j] < best:
                best = mine[j]
        return best

    def _candidates(self) -> tuple:
        """The rules that are not kube-proxy service rules (ascending), and the service
        rules' positions by their destination address."""
        if self._by_dst is None:
            others, by_dst = [], {}
            for i, dst in enumerate(self._service_destinations()):
                if dst is None:
                    others.append(i)
                else:
                    by_dst.setdefault(dst, []).append(i)
            self._by_dst = (others, by_dst)
        return self._by_dst

    def _service_destinations(self) -> list:
        """Per rule, the one address a kube-proxy service rule (``-d IP/32 -p P [-m comment]
        -m P --dport N -j CHAIN``: it reads nothing else) matches, else None; unparsed."""
        if self._dst is None:
            from traceflow.model.lowgc import paused
            with paused():
                self._dst = [m[1] if (m := _SERVICE_RULE.fullmatch(rest)) else None
                             for _, _, rest in self._entries()]
        return self._dst

    def rule_at(self, index: int) -> Rule:
        if self._parsed is None:
            self._parsed = [None] * self.rule_count()
        rule = self._parsed[index]
        if rule is not None:
            return rule
        number, line, rest = self._entries()[index]
        source = Source(self._ruleset.name, number, line)
        found: list[InputError] = []

        def error(src, reason):
            found.append(RuleSyntaxError.at(src, reason))
        diagnostics: list[InputError] = []
        rule = _rule_of(source, line, rest, diagnostics, error)
        diagnostics += found
        _resolve_rule_targets(self._table, [rule], diagnostics)
        self._ruleset.diagnostics.extend(diagnostics)
        bad = [d for d in diagnostics if isinstance(d, RuleSyntaxError)]
        if bad:
            raise RuleSyntaxError(bad[0].reason, bad[0].file, bad[0].line, bad[0].text)
        self._parsed[index] = rule
        return rule

    @property
    def rules(self) -> list[Rule]:
        return [self.rule_at(i) for i in range(self.rule_count())]

    @rules.setter
    def rules(self, value: list[Rule]) -> None:
        raise AttributeError("a lazily read chain's rules come from its lines")


def save_layout(ruleset: Ruleset) -> dict | None:
    """Where each table's chains and rules are in the file, for a lazily read ruleset without
    diagnostics (JSON-able; traceflow.bundle.index stores it); None otherwise."""
    if ruleset.diagnostics:
        return None
    tables = []
    for table in ruleset.tables.values():
        chains = []
        for chain in table.chains.values():
            if not isinstance(chain, LazyChain):
                if chain.rules:
                    return None
                numbers = []
            else:
                numbers = chain._numbers if chain._lines is None else \
                    [n for n, _, _ in chain._lines]
            chains.append([chain.name, chain.policy, numbers])
        tables.append([table.name, chains])
    return {"tables": tables, "caveats": list(ruleset.caveats)}


def from_save_layout(text: str, name: str, layout: dict) -> Ruleset:
    """The lazily read ruleset of ``text`` from its stored layout (``save_layout``), without a
    pass over the file's lines."""
    ruleset = Ruleset(name)
    lines = text.splitlines()
    last = len(lines)
    for table_name, chains in layout["tables"]:
        if table_name not in TABLES:
            raise ValueError(f"table {table_name!r}")
        table = ruleset.table(table_name)
        for chain, policy, numbers in chains:
            if not all(type(n) is int and 0 < n <= last for n in numbers):
                raise ValueError("line number out of range")
            table.chains[str(chain)] = LazyChain(str(chain), policy if policy is None
                                                 else str(policy), None, table, ruleset,
                                                 numbers, lines)
    ruleset.caveats.extend(str(c) for c in layout["caveats"])
    return ruleset


def parse_iptables_save(text: str, name: str, default_table: str | None = None,
                        lazy: bool = False) -> Ruleset:
    """Read ``iptables-save`` output (all tables; ``-c`` counters allowed).

    ``lazy``: every line's shape is checked now (tables, chain declarations, ``-A CHAIN``), but
    a rule's words are parsed when its chain is first read (``LazyChain``), so that errors
    inside a rule surface (located, exit 2) when a trace reads that chain.

    Lines outside any ``*table`` section (e.g. ``iptables-save | grep cilium``) cannot be placed
    in a table: we do not guess one from chain names. They are one syntax error unless the
    caller names ``default_table``, in which case they are read into it and a caveat says so.
    """
    if default_table is not None and default_table not in TABLES:
        raise ValueError(f"default_table must be one of {TABLES}")
    reader = _SaveReader(name, default_table, lazy)
    pending = reader.pending
    lines = text.splitlines()
    reader.lines = lines
    current = None                  # the table whose chains ``numbers`` holds
    numbers: dict = {}
    for number, line in enumerate(lines, 1):
        if lazy and reader.table is not None and line.startswith("-A "):
            # the common line: only its chain is read now, and its number kept (220,000 of
            # them at 20k Services; LazyChain reads the words when the chain is walked);
            # anything else goes through feed()
            space = line.find(" ", 3)
            if space > 3 and not line[space + 1:space + 2].isspace() \
                    and len(line) > space + 1 and "\t" not in line[3:space]:
                table = reader.table
                if table is not current:
                    current, numbers = table, {}
                chain = line[3:space]
                found = numbers.get(chain)
                if found is None:
                    key = (table.name, chain)
                    found = pending.get(key)
                    if found is None:
                        if chain not in table.chains:
                            table.chains[chain] = Chain(chain, None)
                        found = pending[key] = []
                    numbers[chain] = found
                found.append(number)
                continue
        if lazy and reader.table is not None and line.startswith(":"):
            declared = _CHAIN_DECL.match(line)     # a chain declaration, read the same way
            if declared:
                chains, policy = reader.table.chains, declared[2]
                known = chains.get(declared[1])
                if known is None:
                    chains[declared[1]] = Chain(declared[1], None if policy == "-" else policy)
                elif policy != "-":
                    known.policy = policy
                continue
        reader.feed(Source(name, number, line))
    return reader.finish()
