"""nftables rules as written -> rule expressions: tokens, the rule reader (matches against
selectors, statements, verdicts, iptables-nft's xt lines) and set/map elements, every rule
with its ``Source``. The file around the rules (tables, chains, sets) is read by nft_parse.
See ``traceflow.engines.netfilter.nft``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import NamedTuple

from traceflow.model.errors import Source
from traceflow.engines.netfilter.iptables import SetMatch, nat_to
from traceflow.engines.netfilter.nft_model import (Cmp, Elements, Expr, Limit, Nat, NftElement,
                                                   Notrack, Passive, RawPattern, Selector, SetRef,
                                                   SetStmt, Unknown, VMap, Verdict, VerdictStmt,
                                                   XtMatch, _BITWISE, _CT, _META, _META_SHORT,
                                                   _PAYLOAD, _PAYLOAD_HEADERS, _RELATIONS,
                                                   _SELECTOR_HEADS, _Unparsed, _strip_quotes,
                                                   pattern)

# ---------------------------------------------------------------------------------------------
# Tokens


class _Tok(NamedTuple):
    kind: str        # "w" word, "s" string, "p" punctuation, "h" # comment, "nl" newline
    text: str
    line: int
    pos: int
    end: int


_TOKEN = re.compile(r"""
    (?P<nl>\n)
  | (?P<ws>[ \t\r\f\v]+)
  | (?P<s>"(?:[^"\\\n]|\\.)*")
  | (?P<bad>"[^\n]*)
  | (?P<h>\#[^\n]*)
  | (?P<p>[{};,()])
  | (?P<w>[^\s{};,()"#]+)
""", re.VERBOSE)


def _tokenize(text: str, line: int = 1, base: int = 0) -> tuple[list[_Tok], list[int]]:
    """Tokens, and the lines holding an unterminated string."""
    toks: list[_Tok] = []
    bad: list[int] = []
    for found in _TOKEN.finditer(text):
        kind = found.lastgroup
        if kind == "nl":
            toks.append(_Tok("nl", "\n", line, base + found.start(), base + found.end()))
            line += 1
        elif kind == "bad":
            bad.append(line)
        elif kind != "ws":
            toks.append(_Tok(kind, found.group(), line, base + found.start(), base + found.end()))
    return toks, bad


# ---------------------------------------------------------------------------------------------
# Reading rules


_VERDICT_WORDS = frozenset({"accept", "drop", "reject", "return", "continue", "jump", "goto",
                            "queue"})
_STATEMENT_WORDS = frozenset({"counter", "log", "limit", "comment", "dnat", "snat",
                              "masquerade", "redirect", "notrack", "update", "add", "delete",
                              "tproxy", "dup", "fwd", "synproxy", "quota", "flow", "xt",
                              "last"}) | _VERDICT_WORDS
# a word where an expression or statement may begin: where an unreadable stretch ends
_RESYNC = _STATEMENT_WORDS | _SELECTOR_HEADS
_NAT_FLAGS = frozenset({"random", "fully-random", "random-fully", "persistent", "netmap",
                        "prefix"})


class _RuleReader:
    """Reads one rule's tokens into expressions (``parse``); ``_Unparsed`` marks garbage."""

    def __init__(self, toks: list[_Tok], text: str, source: Source, notes: list[str]):
        self.toks = toks
        self.text = text                   # the whole file: expression texts are slices of it
        self.source = source
        self.notes = notes                 # NotModelled reasons for this rule
        self.i = 0
        self.handle: int | None = None
        self.comment: str | None = None

    # -- cursor helpers

    def peek(self, ahead: int = 0) -> _Tok | None:
        j = self.i + ahead
        return self.toks[j] if j < len(self.toks) else None

    def word(self, ahead: int = 0) -> str | None:
        tok = self.peek(ahead)
        return tok.text if tok is not None and tok.kind in ("w", "p", "s") else None

    def take(self, what: str = "a value") -> _Tok:
        tok = self.peek()
        if tok is None or tok.kind == "h":
            raise _Unparsed(f"expected {what} at the end of the rule")
        self.i += 1
        return tok

    def span(self, start: int) -> str:
        end = min(max(start, self.i - 1), len(self.toks) - 1)   # a truncated rule ends early
        first, last = self.toks[start], self.toks[end]
        return " ".join(self.text[first.pos:last.end].split())

    # -- the rule

    def parse(self) -> list[Expr]:
        exprs: list[Expr] = []
        first = True
        while self.i < len(self.toks):
            tok = self.toks[self.i]
            if tok.kind == "h":
                self._hash(tok, exprs)
                continue
            if tok.kind == "p" and tok.text == ";":
                self.i += 1
                continue
            start = self.i
            if first and (tok.kind != "w" or tok.text not in _RESYNC):
                raise _Unparsed(f"`{tok.text}` does not start an nftables expression or "
                                "statement")
            first = False
            try:
                expr = self._expr()
            except _Unparsed as exc:
                self.i = start + 1
                self._skip_to_resync()
                expr = Unknown(self.span(start), f"cannot read `{self.span(start)}`: {exc}")
            if isinstance(expr, Unknown):
                self.notes.append(expr.reason)
            elif isinstance(expr, (Cmp, VMap)):
                self.notes += [f"`{sel}` is not modelled: the rule stops a trace that reaches "
                               "it as UNKNOWN" for sel in expr.key if sel.getter is None]
            if expr is not None:
                exprs.append(expr)
        return exprs

    def _skip_to_resync(self) -> None:
        while self.i < len(self.toks):
            tok = self.toks[self.i]
            if tok.kind == "h" or (tok.kind == "w" and tok.text in _RESYNC):
                return
            if tok.text == "{" and tok.kind == "p":
                self._skip_braces()
                continue
            self.i += 1

    def _skip_braces(self) -> None:
        depth = 0
        while self.i < len(self.toks):
            tok = self.toks[self.i]
            self.i += 1
            if tok.kind == "p" and tok.text == "{":
                depth += 1
            elif tok.kind == "p" and tok.text == "}":
                depth -= 1
                if depth == 0:
                    return

    def _hash(self, tok: _Tok, exprs: list[Expr]) -> None:
        """``# handle 12`` (nft -a), or an iptables-nft extension shown as a comment."""
        self.i += 1
        body = tok.text[1:].strip()
        handle = re.fullmatch(r"handle (\d+)", body)
        if handle:
            self.handle = int(handle[1])
            return
        xt_text, rest = _split_xt(tok.text, tok.line, tok.pos)
        if xt_text:
            exprs.append(_xt_expr(xt_text))
            if isinstance(exprs[-1], Unknown):
                self.notes.append(exprs[-1].reason)
        if rest:
            self.toks[self.i:self.i] = rest

    def _expr(self) -> Expr | None:
        head = self.word()
        if head in _STATEMENTS:
            return _STATEMENTS[head](self)
        start = self.i
        key = self._key()
        nxt = self.word()
        if nxt == "vmap":
            self.i += 1
            return VMap(key, self._table(key), self.span(start))
        if nxt == "set":
            return self._set_stmt(start, key)
        if nxt == "map":
            raise _Unparsed("a map lookup outside a statement")
        op = "=="
        if nxt in _RELATIONS and self.peek().kind == "w":
            op = _RELATIONS[nxt]
            self.i += 1
        rhs = self._rhs(key)
        return Cmp(key, op, rhs, self.span(start))

    # -- selectors

    def _key(self) -> tuple[Selector, ...]:
        """One selector or a concatenation ``a . b . c``, each with its bitwise operations."""
        parts = [self._selector()]
        while self.word() == ".":
            self.i += 1
            parts.append(self._selector())
        return tuple(parts)

    def _selector(self) -> Selector:
        start = self.i
        head = self.take("a selector").text
        if head == "meta":
            key = self.take("a meta key").text
            dtype, getter = _META.get(key, ("raw", None))
        elif head in _META_SHORT:
            key = head
            dtype, getter = _META.get(key, ("raw", None))
        elif head == "ct":
            key = self.take("a ct key").text
            if key in ("original", "reply"):
                key += " " + self.take("a ct field").text
                if key.split()[1] in ("ip", "ip6"):
                    key += " " + self.take("an address field").text
            dtype, getter = _CT.get(key, ("raw", None))
        elif head == "fib":
            return self._fib(start)
        elif head == "numgen":
            return self._numgen(start)
        elif head in ("jhash", "symhash"):
            self._skip_hash_args()
            return self._with_ops(Selector(self.span(start), "integer", None))
        elif head in ("socket", "osf", "rt"):
            self.take(f"a {head} key")
            dtype, getter = "raw", None
        elif head in _PAYLOAD_HEADERS:
            fld = self.take(f"a {head} field").text
            dtype, getter = _PAYLOAD.get((head, fld), ("raw", None))
            return self._with_ops(Selector(self.span(start), dtype, getter, header=head))
        else:
            raise _Unparsed(f"`{head}` is not a selector")
        return self._with_ops(Selector(self.span(start), dtype, getter))

    def _with_ops(self, sel: Selector) -> Selector:
        ops = []
        while self.word() in _BITWISE:
            op = _BITWISE[self.take().text]
            operand = self._operand()
            if operand is None:
                sel = dataclasses.replace(sel, getter=None)
            else:
                ops.append((op, operand))
        return dataclasses.replace(sel, ops=tuple(ops)) if ops else sel

    def _operand(self) -> int | None:
        """A constant after & | ^; a parenthesised flag list gives None (not modelled)."""
        tok = self.take("an operand")
        if tok.text == "(":
            while self.word() not in (")", None):
                self.i += 1
            self.take("`)`")
            return None
        try:
            return int(tok.text, 0)
        except ValueError:
            return None

    def _fib(self, start: int) -> Selector:
        flags = [self.take("a fib flag").text]
        while self.word() == ".":
            self.i += 1
            flags.append(self.take("a fib flag").text)
        result = self.take("a fib result").text
        if result != "type" or flags[0] not in ("saddr", "daddr"):
            return Selector(self.span(start), "raw", None)
        getter = f"fib_{flags[0]}" + ("_iif" if "iif" in flags else "")
        if set(flags[1:]) - {"iif", "mark"}:
            getter = None
        return Selector(self.span(start), "fib_addrtype", getter)

    def _numgen(self, start: int) -> Selector:
        mode = self.take("numgen random|inc").text
        if self.take("`mod`").text != "mod":
            raise _Unparsed("numgen without `mod N`")
        modulus = self._number("a modulus")
        offset = 0
        if self.word() == "offset":
            self.i += 1
            offset = self._number("an offset")
        if mode not in ("random", "inc") or modulus < 1:
            raise _Unparsed(f"numgen {mode} mod {modulus}")
        return Selector(self.span(start), "integer", "numgen", (), modulus, offset)

    def _number(self, what: str) -> int:
        tok = self.take(what)
        try:
            return int(tok.text, 0)
        except ValueError:
            raise _Unparsed(f"expected {what}, found `{tok.text}`") from None

    def _skip_hash_args(self) -> None:
        while self.word() not in (None, "mod"):
            self.i += 1
        for _ in range(2):
            self.take("`mod N`")
        while self.word() in ("seed", "offset"):
            self.i += 2

    # -- right-hand sides

    def _rhs(self, key: tuple[Selector, ...]) -> SetRef | Elements:
        tok = self.take("a value")
        if tok.kind == "w" and tok.text.startswith("@"):
            return SetRef(tok.text[1:])
        if tok.kind == "p" and tok.text == "{":
            return Elements(tuple(self._elements(key, verdicts=False)))
        if tok.kind not in ("w", "s"):
            raise _Unparsed(f"unexpected `{tok.text}`")
        self.i -= 1
        items = [self._element(key, verdicts=False, in_braces=False)]
        while self.word() == ",":
            self.i += 1
            items.append(self._element(key, verdicts=False, in_braces=False))
        return Elements(tuple(items))

    def _table(self, key: tuple[Selector, ...]) -> SetRef | Elements:
        tok = self.take("a map")
        if tok.kind == "w" and tok.text.startswith("@"):
            return SetRef(tok.text[1:])
        if tok.kind == "p" and tok.text == "{":
            return Elements(tuple(self._elements(key, verdicts=True)))
        raise _Unparsed("vmap needs @map or { ... }")

    def _elements(self, key, verdicts: bool) -> list[NftElement]:
        """Elements up to the closing ``}`` (the ``{`` is already taken)."""
        items = []
        while True:
            word = self.word()
            if word is None:
                raise _Unparsed("unclosed `{`")
            if word == "}":
                self.i += 1
                return items
            if word == ",":
                self.i += 1
                continue
            items.append(self._element(key, verdicts))

    def _element(self, key, verdicts: bool, in_braces: bool = True) -> NftElement:
        return _read_element(self, tuple(s.dtype for s in key), "verdict" if verdicts else None,
                            in_braces)

    # -- statements

    def _set_stmt(self, start: int, key: tuple[Selector, ...]) -> Expr:
        """``KEY set VALUE [op CONST ...]``; VALUE is a constant or a mark selector."""
        self.i += 1                                       # "set"
        target = key[0]
        if len(key) != 1 or target.ops:
            raise _Unparsed("`set` on a concatenation or a masked value")
        base: Selector | int | None
        if self.word() in _SELECTOR_HEADS:
            inner = self._selector()
            base, ops, readable = dataclasses.replace(inner, ops=()), inner.ops, inner.getter
        else:
            tok = self.take("a value")
            try:
                base = int(tok.text, 0)
            except ValueError:
                base = None
            rest = self._with_ops(Selector("", "mark", "const"))
            ops, readable = rest.ops, rest.getter
        text = self.span(start)
        modelled_base = isinstance(base, int) or (isinstance(base, Selector)
                                                  and base.getter in ("mark", "ct_mark"))
        if target.getter in ("mark", "ct_mark") and modelled_base and readable:
            return SetStmt(target, base, tuple(ops), text)
        if target.text in ("meta nftrace", "nftrace", "meta priority", "priority",
                           "ct helper"):
            return Passive(text, f"{target.text} has no effect on the packet's path")
        return Unknown(text, f"`{text}` is not modelled", statement=True)


def _read_element(rd: _RuleReader, dtypes: tuple[str, ...], data_type: str | None,
                 in_braces: bool = True) -> NftElement:
    """``key [. key ...] [timeout T] [expires T] [comment "c"] [counter ...] [: data]``.

    Element options exist only inside braces: in ``ip daddr 10.0.0.1 counter accept`` the
    counter is a statement of the rule.
    """
    start = rd.i
    line = rd.peek().line
    parts = [rd.take("an element").text]
    while rd.word() == ".":
        rd.i += 1
        parts.append(rd.take("an element component").text)
    comment = expires = None
    while in_braces and rd.word() in ("timeout", "expires", "comment", "counter", "packets",
                                      "bytes"):
        opt = rd.take().text
        if opt == "counter":
            continue
        value = rd.take(f"the value of {opt}").text
        if opt == "comment":
            comment = _strip_quotes(value)
        elif opt == "expires":
            expires = value
    data: Verdict | str | None = None
    if rd.word() == ":":
        rd.i += 1
        if data_type == "verdict":
            data = _verdict(rd)
        else:
            dstart = rd.i
            rd.take("map data")
            while rd.word() == ".":
                rd.i += 2
            data = rd.span(dstart)
    if len(parts) == len(dtypes):
        key = tuple(pattern(t, p) for t, p in zip(dtypes, parts))
    else:
        reason = (f"element `{' . '.join(parts)}` has {len(parts)} components; the key has "
                  f"{len(dtypes)}")
        key = tuple(RawPattern(p, reason) for p in parts)
    return NftElement(key, data, rd.span(start), line, comment, expires)


def _verdict(rd: _RuleReader) -> Verdict:
    kind = rd.take("a verdict").text
    if kind not in _VERDICT_WORDS:
        raise _Unparsed(f"`{kind}` is not a verdict")
    if kind in ("jump", "goto"):
        return Verdict(kind, _strip_quotes(rd.take("a chain name").text))
    if kind == "reject" and rd.word() == "with":
        start = rd.i
        rd.i += 1
        rd.take("a reject type")
        if rd.word() == "type":
            rd.i += 1
            rd.take("a reject code")
        elif rd.word() not in _RESYNC and rd.word() not in (None, ";", "}", ","):
            rd.take()
        return Verdict(kind, rd.span(start))
    if kind == "queue":
        while rd.word() in ("num", "flags", "bypass", "fanout", "to"):
            rd.i += 1 if rd.word() in ("bypass", "fanout") else 2
    return Verdict(kind)


def _st_verdict(rd: _RuleReader) -> Expr:
    start = rd.i
    verdict = _verdict(rd)
    if verdict.kind == "queue":
        return Unknown(rd.span(start), "queue to userspace is not modelled", statement=True)
    return VerdictStmt(verdict, rd.span(start))


def _st_counter(rd: _RuleReader) -> Expr:
    start = rd.i
    rd.i += 1
    while rd.word() in ("packets", "bytes", "name"):
        rd.i += 2
    return Passive(rd.span(start))


def _st_log(rd: _RuleReader) -> Expr:
    start = rd.i
    rd.i += 1
    while rd.word() in ("prefix", "level", "flags", "group", "snaplen", "queue-threshold"):
        rd.i += 2
        while rd.word() == ",":
            rd.i += 2
    return Passive(rd.span(start))


def _st_limit(rd: _RuleReader) -> Expr:
    start = rd.i
    rd.i += 1
    over = False
    while rd.word() is not None and rd.word() not in _RESYNC:
        over = over or rd.word() == "over"
        rd.i += 1
    return Limit(rd.span(start), over)


def _st_comment(rd: _RuleReader) -> Expr | None:
    rd.i += 1
    rd.comment = _strip_quotes(rd.take("a comment string").text)
    return None


def _st_nat(rd: _RuleReader) -> Expr:
    start = rd.i
    kind = rd.take().text
    to = None
    if kind in ("dnat", "snat"):
        if rd.word() in ("ip", "ip6"):
            rd.i += 1
        if rd.word() != "to":
            raise _Unparsed(f"{kind} without `to`")
        rd.i += 1
        target = rd.take("a NAT address").text
        if rd.word() in (".", "map") or target in _SELECTOR_HEADS:
            rd._skip_to_resync()
            return Unknown(rd.span(start), f"{kind} to a mapped address is not modelled",
                           statement=True)
        if target.count(":") > 1 and not target.startswith("["):
            target = f"[{target}]"                       # a bare IPv6 address
        try:
            to = nat_to(target)
        except ValueError as exc:
            raise _Unparsed(str(exc)) from None
    elif kind in ("masquerade", "redirect") and rd.word() == "to":
        rd.i += 1
        ports = rd.take("`:port`").text
        try:
            to = nat_to(ports)
        except ValueError as exc:
            raise _Unparsed(str(exc)) from None
    flags = []
    while rd.word() in _NAT_FLAGS or (flags and rd.word() == ","):
        word = rd.take().text
        if word != ",":
            flags.append(word)
    text = rd.span(start)
    if kind == "redirect":
        return Unknown(text, "redirect (DNAT to the incoming interface's address) is not "
                             "modelled", statement=True)
    return Nat(kind, to, tuple(flags), text)


def _st_notrack(rd: _RuleReader) -> Expr:
    rd.i += 1
    return Notrack("notrack")


def _st_set_update(rd: _RuleReader) -> Expr:
    start = rd.i
    verb = rd.take().text
    ref = rd.take("a set reference").text
    if not ref.startswith("@"):
        raise _Unparsed(f"{verb} needs @set")
    if rd.word() == "{":
        rd._skip_braces()
    text = rd.span(start)
    return Passive(text, f"records the packet in dynamic set {ref} (session affinity for later "
                         "connections); not simulated")


def _st_unknown(rd: _RuleReader) -> Expr:
    start = rd.i
    word = rd.take().text
    rd._skip_to_resync()
    return Unknown(rd.span(start), f"statement `{word}` is not modelled", statement=True)


_STATEMENTS: dict[str, Callable[[_RuleReader], Expr | None]] = {
    **{v: _st_verdict for v in _VERDICT_WORDS},
    "counter": _st_counter, "log": _st_log, "limit": _st_limit, "comment": _st_comment,
    "dnat": _st_nat, "snat": _st_nat, "masquerade": _st_nat, "redirect": _st_nat,
    "notrack": _st_notrack, "update": _st_set_update, "add": _st_set_update,
    "delete": _st_set_update,
    **{w: _st_unknown for w in ("tproxy", "dup", "fwd", "synproxy", "quota", "flow", "xt",
                                "last")},
}


# iptables-nft: nft prints extensions it cannot translate as ``# match-set NAME dst,dst``


# where the nft text resumes after an extension's comment; narrower than _RESYNC because
# extension options use words like ``dst`` (``match-set S dst,dst``) that are also headers
_XT_RESYNC = (_STATEMENT_WORDS - {"redirect"}) | {"meta", "ip", "ip6", "ct", "tcp", "udp",
                                                  "sctp", "th", "iifname", "oifname", "iif",
                                                  "oif", "fib", "mark"}


def _split_xt(text: str, line: int, pos: int) -> tuple[str, list[_Tok]]:
    """The extension's text and the tokens of the nft expressions after it on the line.

    A target (``# TPROXY redirect ...``, upper case like every xtables target) ends the rule.
    """
    body = text[1:]
    words = body.split()
    if not words or words[0].isupper():
        return body.strip(), []
    toks, _ = _tokenize(body, line, pos + 1)
    for k, tok in enumerate(toks):
        if tok.kind == "w" and tok.text in _XT_RESYNC and k > 0:
            return body[:tok.pos - pos - 1].strip(), toks[k:]
    return body.strip(), []


def _xt_expr(text: str) -> Expr:
    words = text.split()
    negated = words[:1] == ["!"]
    if negated:
        words = words[1:]
    if len(words) == 3 and words[0] == "match-set":
        flags = tuple(words[2].split(","))
        return XtMatch(SetMatch("match-set", words[1], flags, negated=negated), text)
    what = "target" if words and words[0].isupper() else "match"
    return Unknown(f"# {text}", f"iptables-nft {what} `{text}` is shown by nft only as a "
                                "comment: not modelled", statement=what == "target")


def _is_xt_line(text: str) -> bool:
    body = text[1:].strip()
    if not body or body.split()[0].endswith(":") or body.startswith("handle "):
        return False
    xt_text, rest = _split_xt(text, 0, 0)
    return bool(xt_text and rest)
