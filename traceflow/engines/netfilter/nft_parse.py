"""nftables parser: ``nft list ruleset`` text -> ``NftRuleset``: tables, chains (their
headers), sets and maps, every rule with its ``Source``; the rules themselves are read by
nft_rules (tokens, expressions, statements). See ``traceflow.engines.netfilter.nft``.
"""

from __future__ import annotations

import re

from traceflow.model.errors import Source
from traceflow.engines.netfilter.iptables import NotModelled, RuleSyntaxError
from traceflow.engines.netfilter.nft_model import (BRIDGE_PRIORITY_NAMES, FAMILIES, HOOKS,
                                                   NftChain, NftRule, NftSet,
                                                   NftTable, PRIORITY_NAMES, Unknown, XtMatch,
                                                   _Unparsed, _strip_quotes)
from traceflow.engines.netfilter.nft_ruleset import NftRuleset
from traceflow.engines.netfilter.nft_rules import (_RuleReader, _Tok, _is_xt_line, _read_element,
                                                   _tokenize)

# ---------------------------------------------------------------------------------------------
# Reading the file: tables, chains, sets


class _FileReader:
    """Reads the whole text, or (``start``/``end``, character offsets at line starts) one
    stretch of it that begins on line ``first_line``: one block read on first use
    (traceflow.engines.netfilter.nft_lazy). Offsets and line numbers stay those of the whole file."""

    def __init__(self, text: str, name: str, start: int = 0, end: int | None = None,
                 first_line: int = 1):
        self.text = text
        self.name = name
        part = text if start == 0 and end is None else text[start:end]
        self.lines = part.split("\n")
        self.first_line = first_line
        self.toks, bad = _tokenize(part, first_line, start)
        self.i = 0
        self.ruleset = NftRuleset(name)
        self.xt_rules = 0
        for line in bad:
            self.error(line, "unterminated string (missing closing `\"`)")

    # -- helpers

    def source(self, line: int) -> Source:
        return Source(self.name, line, self.lines[line - self.first_line].rstrip("\r"))

    def error(self, line: int, reason: str) -> None:
        found = self.ruleset.diagnostics
        if found and found[-1].line == line and found[-1].reason == reason:
            return       # the same problem again on the same line (100,000 stray `}`): once
        found.append(RuleSyntaxError.at(self.source(line), reason))

    def peek(self) -> _Tok | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def skip_blank(self, in_chain: bool = False) -> None:
        """Newlines and comment lines (in a chain, a comment line may be an iptables-nft rule)."""
        while self.i < len(self.toks):
            tok = self.toks[self.i]
            if tok.kind == "nl" or (tok.kind == "p" and tok.text == ";") or tok.kind == "h" and not (in_chain and _is_xt_line(tok.text)):
                self.i += 1
            else:
                return

    def line(self) -> list[_Tok]:
        """Tokens up to the end of the line or ``;`` (braces may span lines); stops before an
        unmatched ``}``."""
        out: list[_Tok] = []
        opened: list[_Tok] = []
        while self.i < len(self.toks):
            tok = self.toks[self.i]
            if tok.kind == "nl":
                self.i += 1
                if not opened:
                    break
                continue
            if tok.kind == "p":
                if tok.text == ";" and not opened:
                    self.i += 1
                    break
                if tok.text == "{":
                    opened.append(tok)
                elif tok.text == "}":
                    if not opened:
                        break
                    opened.pop()
            out.append(tok)
            self.i += 1
        if opened:
            self.error(opened[0].line, "`{` is never closed (unbalanced braces)")
        return out

    def block_open(self, words: list[_Tok], what: str) -> bool:
        """The header line ends in ``{``: consume it (and any ``# handle``)."""
        tok = self.peek()
        if tok is not None and tok.kind == "p" and tok.text == "{":
            self.i += 1
            while self.peek() is not None and self.peek().kind == "h":
                self.i += 1
            return True
        line = tok.line if tok is not None else words[-1].line
        self.error(line, f"expected `{{` after {what}")
        self.skip_statement()
        return False

    def skip_statement(self) -> None:
        """The rest of the statement, with any ``{ ... }`` block it opens."""
        self.line()

    def reader(self, toks: list[_Tok], source: Source, notes: list[str]) -> _RuleReader:
        return _RuleReader(toks, self.text, source, notes)

    def span_text(self, toks: list[_Tok]) -> str:
        text = self.text[toks[0].pos:toks[-1].end]
        return " ".join(text.split()) if "\n" in text else text.strip()

    # -- top level

    def read(self) -> NftRuleset:
        while True:
            self.skip_blank()
            tok = self.peek()
            if tok is None:
                break
            if tok.kind == "p" and tok.text == "}":
                self.error(tok.line, "unbalanced `}`: no block is open here")
                self.i += 1
                continue
            if tok.kind == "w" and tok.text == "table":
                self.table()
                continue
            self.error(tok.line, "not `nft list` output: expected `table FAMILY NAME {`")
            self.skip_statement()
        if self.xt_rules:
            self.ruleset.caveats.append(
                f"{self.xt_rules} rules use iptables extensions that nft shows only as "
                "`# ...` comments (iptables-nft): `match-set` is read against the ipsets; the "
                "others stop the trace as UNKNOWN")
        return self.ruleset

    def table(self) -> None:
        start = self.peek()
        self.i += 1
        words = []
        while self.peek() is not None and self.peek().kind in ("w", "s"):
            words.append(self.toks[self.i])
            self.i += 1
        if len(words) == 1:
            family, name = "ip", _strip_quotes(words[0].text)
        elif len(words) == 2 and words[0].text in FAMILIES:
            family, name = words[0].text, _strip_quotes(words[1].text)
        else:
            self.error(start.line, "expected `table [FAMILY] NAME {` with FAMILY one of "
                       + ", ".join(FAMILIES))
            self.skip_statement()
            return
        if not self.block_open(words or [start], f"table {family} {name}"):
            return
        key = f"{family} {name}"
        table = self.ruleset.tables.get(key)
        if table is None:
            table = self.ruleset.tables[key] = NftTable(family, name, self.source(start.line))
        while True:
            self.skip_blank()
            tok = self.peek()
            if tok is None:
                self.error(start.line, f"table {key} is never closed (missing `}}`)")
                return
            if tok.kind == "p" and tok.text == "}":
                self.i += 1
                return
            self.table_item(table, tok)

    def table_item(self, table: NftTable, tok: _Tok) -> None:
        word = tok.text if tok.kind == "w" else None
        if word == "chain":
            self.chain(table)
        elif word in ("set", "map"):
            self.set(table, word)
        elif word in ("comment", "flags"):
            toks = self.line()
            values = tuple(_strip_quotes(t.text) for t in toks[1:] if t.text != ",")
            if word == "comment" and len(values) == 1:
                table.comment = values[0]
            elif word == "flags":
                table.flags = values
            else:
                self.error(tok.line, "expected `comment \"TEXT\"`")
        elif word in ("flowtable", "counter", "quota", "limit", "secmark", "synproxy", "ct",
                      "tunnel"):
            toks = self.line()
            kind = " ".join(t.text for t in toks[:2]) if word == "ct" else word
            name = toks[2 if word == "ct" else 1].text if len(toks) > 1 else "?"
            table.objects.append((kind, _strip_quotes(name), self.source(tok.line)))
            self.ruleset.diagnostics.append(NotModelled.at(
                self.source(tok.line), f"{kind} object {name} is kept but not modelled"))
        else:
            self.error(tok.line, f"`{tok.text}` is not a table item (expected chain, set, map, "
                       "comment, flags or a stateful object)")
            self.skip_statement()

    def chain(self, table: NftTable) -> None:
        start = self.toks[self.i]
        self.i += 1
        tok = self.peek()
        if tok is None or tok.kind not in ("w", "s"):
            self.error(start.line, "expected a chain name after `chain`")
            self.skip_statement()
            return
        self.i += 1
        name = _strip_quotes(tok.text)
        if not self.block_open([tok], f"chain {name}"):
            return
        chain = table.chains.get(name)
        if chain is None:
            chain = table.chains[name] = NftChain(name, self.source(start.line))
        while True:
            self.skip_blank(in_chain=True)
            tok = self.peek()
            if tok is None:
                self.error(start.line, f"chain {name} is never closed (missing `}}`)")
                return
            if tok.kind == "p" and tok.text == "}":
                self.i += 1
                return
            toks = self.line()
            if toks:
                self.chain_line(table, chain, toks)

    def chain_line(self, table: NftTable, chain: NftChain, toks: list[_Tok]) -> None:
        first = toks[0].text if toks[0].kind == "w" else None
        if first == "type":
            self.chain_header(table, chain, toks)
        elif first == "policy" and len(toks) == 2:
            chain.policy = toks[1].text
            if chain.policy not in ("accept", "drop"):
                self.error(toks[0].line, f"bad chain policy {chain.policy!r}")
        elif first == "comment" and len(toks) == 2 and toks[1].kind == "s" and not chain.rules:
            chain.comment = _strip_quotes(toks[1].text)
        elif first == "devices":
            chain.device = " ".join(t.text for t in toks[2:] if t.kind in ("w", "s"))
        else:
            self.rule(chain, toks)

    def chain_header(self, table: NftTable, chain: NftChain, toks: list[_Tok]) -> None:
        words = [t.text for t in toks]
        line = toks[0].line
        try:
            if words[2] != "hook":
                raise ValueError(words[2])
            chain.type, chain.hook = words[1], words[3]
            k = words.index("priority")
            between = words[4:k]
            if between[:1] == ["device"] and len(between) == 2:
                chain.device = _strip_quotes(between[1])
            elif between[:1] == ["devices"]:
                chain.device = " ".join(_strip_quotes(w) for w in between[1:]
                                        if w not in ("=", "{", "}", ","))
            elif between:
                raise ValueError(" ".join(between))
            chain.priority_text = " ".join(words[k + 1:])
            chain.priority = _priority(chain.priority_text, table.family)
        except (IndexError, ValueError):
            self.error(line, "bad base chain header (expected `type T hook H [device D] "
                       "priority P;`)")
            chain.hook = None
            return
        if chain.type not in ("filter", "nat", "route"):
            self.error(line, f"unknown chain type {chain.type!r}")
        if chain.hook not in HOOKS + ("ingress", "egress"):
            self.error(line, f"unknown hook {chain.hook!r}")

    def rule(self, chain: NftChain, toks: list[_Tok]) -> None:
        source = self.source(toks[0].line)
        text = self.span_text(toks)
        notes: list[str] = []
        rd = self.reader(list(toks), source, notes)
        try:
            exprs = rd.parse()
        except _Unparsed as exc:
            self.error(toks[0].line, f"not an nftables rule: {exc}")
            return
        if any(isinstance(e, XtMatch) or (isinstance(e, Unknown) and e.text.startswith("#"))
               for e in exprs):
            self.xt_rules += 1
        chain.rules.append(NftRule(exprs, source, text, rd.handle, rd.comment))
        for note in notes:
            self.ruleset.diagnostics.append(NotModelled.at(source, note))

    def set(self, table: NftTable, kind: str) -> None:
        start = self.toks[self.i]
        self.i += 1
        tok = self.peek()
        if tok is None or tok.kind not in ("w", "s"):
            self.error(start.line, f"expected a {kind} name")
            self.skip_statement()
            return
        self.i += 1
        name = _strip_quotes(tok.text)
        if not self.block_open([tok], f"{kind} {name}"):
            return
        nft_set = table.sets[name] = NftSet(name, kind, self.source(start.line))
        while True:
            self.skip_blank()
            tok = self.peek()
            if tok is None:
                self.error(start.line, f"{kind} {name} is never closed (missing `}}`)")
                return
            if tok.kind == "p" and tok.text == "}":
                self.i += 1
                return
            toks = self.line()
            if toks:
                self.set_line(nft_set, toks)

    def set_line(self, nft_set: NftSet, toks: list[_Tok]) -> None:
        word = toks[0].text
        line = toks[0].line
        if word == "type":
            types = [t.text for t in toks[1:]]
            key, _, data = " ".join(types).partition(" : ")
            nft_set.key_types = tuple(k.strip() for k in key.split(" . "))
            nft_set.data_type = data.strip() or None
            if not all(nft_set.key_types) or (nft_set.kind == "map") != bool(data):
                self.error(line, f"bad {nft_set.kind} type")
        elif word == "typeof":
            self.set_typeof(nft_set, toks)
        elif word == "flags":
            nft_set.flags = tuple(t.text for t in toks[1:] if t.text != ",")
        elif word == "comment" and len(toks) == 2:
            nft_set.comment = _strip_quotes(toks[1].text)
        elif word == "elements":
            self.set_elements(nft_set, toks)
        elif word in ("timeout", "gc-interval", "size", "policy", "auto-merge", "counter",
                      "quota", "devices"):
            nft_set.properties[word] = " ".join(t.text for t in toks[1:])
        else:
            self.error(line, f"`{word}` is not a {nft_set.kind} property")

    def set_typeof(self, nft_set: NftSet, toks: list[_Tok]) -> None:
        notes: list[str] = []
        rd = self.reader(toks[1:], self.source(toks[0].line), notes)
        try:
            key = rd._key()
            if rd.word() == ":":
                rd.i += 1
                data = "verdict" if rd.word() == "verdict" else rd._key()[0].dtype
                nft_set.data_type = data
        except _Unparsed as exc:
            self.error(toks[0].line, f"bad typeof: {exc}")
            return
        nft_set.key_types = tuple(s.dtype for s in key)

    def set_elements(self, nft_set: NftSet, toks: list[_Tok]) -> None:
        if len(toks) < 3 or toks[1].text != "=" or toks[2].text != "{" or toks[-1].text != "}":
            self.error(toks[0].line, "expected `elements = { ... }`")
            return
        notes: list[str] = []
        rd = self.reader(toks[3:-1], self.source(toks[0].line), notes)
        data_type = nft_set.data_type if nft_set.kind == "map" else None
        while rd.peek() is not None:
            if rd.word() == ",":
                rd.i += 1
                continue
            line = rd.peek().line
            try:
                nft_set.elements.append(_read_element(rd, nft_set.key_types, data_type))
            except (_Unparsed, ValueError) as exc:
                self.error(line, f"bad element of {nft_set.kind} {nft_set.name}: {exc}")
                while rd.peek() is not None and rd.word() != ",":
                    rd.i += 1
                continue
            if rd.peek() is not None and rd.word() != ",":
                self.error(rd.peek().line, f"expected `,` between elements of {nft_set.name}, "
                           f"found `{rd.peek().text}`")
                while rd.peek() is not None and rd.word() != ",":
                    rd.i += 1


def _priority(text: str, family: str) -> int:
    """``dstnat``, ``-110``, ``dstnat - 10``, ``filter + 5``, ``mangle-5``."""
    names = BRIDGE_PRIORITY_NAMES if family == "bridge" else PRIORITY_NAMES
    found = re.fullmatch(r"\s*([a-z]+|-?\d+)\s*(?:([+-])\s*(\d+))?\s*", text)
    if not found:
        raise ValueError(text)
    base = names[found[1]] if found[1] in names else int(found[1])
    if found[2]:
        base += int(found[3]) if found[2] == "+" else -int(found[3])
    return base


def parse_nft_ruleset(text: str, name: str) -> NftRuleset:
    """Read ``nft list ruleset`` / ``nft list table ...`` output into an NftRuleset.

    Syntax problems are collected in ``diagnostics`` (``raise_for_errors()`` raises the first);
    constructs that are kept but not modelled are ``NotModelled`` diagnostics.
    """
    return _FileReader(text, name).read()
