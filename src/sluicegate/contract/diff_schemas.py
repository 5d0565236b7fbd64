"""Classify JSON Schema changes as compatible or breaking for the side of the wire they describe.

The rule is containment. A request schema may only grow: everything an old client sends must still be
accepted and mean the same. A response schema may only shrink: everything the server now sends must
still fit what an old client reads. Each keyword change is first labelled with its effect on the set of
accepted documents (widen, narrow, both), and the direction turns that into compatible or breaking.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from sluicegate.contract.schema_walk import (
    RULE_KEYWORDS,
    Bound,
    Node,
    Operation,
    Schema,
    SchemaError,
    additional_properties,
    bound_text,
    branch_key,
    canonical,
    deref,
    discriminator_tag,
    enum_values,
    join_path,
    json_body,
    json_type,
    looser,
    lower_bound,
    match_branches,
    operations,
    split_nullable,
    upper_bound,
)

Direction = Literal["request", "response"]
Reader = Literal["tolerant", "strict"]
Effect = Literal["widen", "narrow", "both", "meaning", "extra", "info"]

__all__ = ["Change", "Direction", "Reader", "SchemaError", "diff_openapi", "diff_schemas"]

_MISSING: Any = object()
_LENGTHS = (("maxLength", True), ("minLength", False), ("maxItems", True), ("minItems", False),
            ("maxProperties", True), ("minProperties", False))


@dataclass(frozen=True)
class Change:
    path: str
    kind: str
    breaking: bool
    reason: str


class _Differ:
    def __init__(self, old_root: Any, new_root: Any, direction: Direction, reader: Reader) -> None:
        if direction not in ("request", "response"):
            raise ValueError(f"direction must be 'request' or 'response', got {direction!r}")
        if reader not in ("tolerant", "strict"):
            raise ValueError(f"reader must be 'tolerant' or 'strict', got {reader!r}")
        self.old_root, self.new_root = old_root, new_root
        self.request = direction == "request"
        self.reader = reader
        self.changes: list[Change] = []
        self._seen: set[tuple[str, str]] = set()

    def add(self, path: str, kind: str, effect: Effect, what: str, why: str | None = None,
            *, forbids_extra: bool = False) -> None:
        breaking, default_why = self._judge(effect, forbids_extra)
        self.changes.append(Change(path, kind, breaking, f"{what}; {why or default_why}"))

    def _judge(self, effect: Effect, forbids_extra: bool) -> tuple[bool, str]:
        if effect == "widen":
            if self.request:
                return False, "everything old clients sent is still accepted"
            return True, "the server may now send what old clients reject"
        if effect == "narrow":
            if self.request:
                return True, "requests old clients send may now be rejected"
            return False, "everything the server sends still fits the old schema"
        if effect == "both":
            return True, "neither version accepts everything the other does"
        if effect == "meaning":
            return True, "the same payload now means something different"
        if effect == "extra":
            if forbids_extra:
                return True, "the old schema forbids additional properties"
            if self.reader == "strict":
                return True, "strict readers reject unknown fields"
            return False, "tolerant readers ignore unknown fields"
        return False, "no client-visible effect"

    def compare(self, old: Any, old_loc: str, new: Any, new_loc: str, path: str,
                *, skip_default: bool = False) -> None:
        o, n = deref(self.old_root, old, old_loc), deref(self.new_root, new, new_loc)
        if (o.loc, n.loc) in self._seen:  # a recursive $ref, or a shared definition already compared
            return
        self._seen.add((o.loc, n.loc))
        if not skip_default:
            self._default(o.schema, n.schema, path)
        o_null, o_branches = split_nullable(self.old_root, o)
        n_null, n_branches = split_nullable(self.new_root, n)
        if n_null and not o_null:
            self.add(path, "nullable_added", "widen", "null is now allowed")
        elif o_null and not n_null:
            self.add(path, "nullable_removed", "narrow", "null is no longer allowed")
        if len(o_branches) == 1 and len(n_branches) == 1:
            self._branch(o_branches[0], n_branches[0], path)
            return
        tag = discriminator_tag(o.schema) or discriminator_tag(n.schema)
        pairs, removed, added = match_branches(o_branches, n_branches, tag)
        for b in removed:
            self.add(path, "branch_removed", "narrow", f"union member {branch_key(b, tag)} removed")
        for b in added:
            self.add(path, "branch_added", "widen", f"union member {branch_key(b, tag)} added")
        for ob, nb in pairs:
            self._branch(ob, nb, f"{path}<{branch_key(nb, tag)}>")

    def _default(self, so: Schema, sn: Schema, path: str) -> None:
        a, b = so.get("default", _MISSING), sn.get("default", _MISSING)
        if a is _MISSING and b is _MISSING:
            return
        if a is _MISSING:
            self.add(path, "default_added", "info", f"default {canonical(b)} documented",
                     "omitting the field had no documented meaning before")
        elif b is _MISSING:
            self.add(path, "default_removed", "meaning", f"default {canonical(a)} removed",
                     "a payload that omits the field no longer has a defined meaning")
        elif canonical(a) != canonical(b):
            self.add(path, "default_changed", "meaning", f"default {canonical(a)} -> {canonical(b)}",
                     "a payload that omits the field now means something different")

    def _branch(self, o: Node, n: Node, path: str) -> None:
        so, sn = o.schema, n.schema
        to, tn = json_type(so), json_type(sn)
        if to != tn:
            if {to, tn} == {"integer", "number"}:
                widen = tn == "number"
                self.add(path, "type_widened" if widen else "type_narrowed", "widen" if widen else "narrow",
                         f"type {to} -> {tn}")
            elif to is None or tn is None:
                widen = tn is None
                self.add(path, "type_widened" if widen else "type_narrowed", "widen" if widen else "narrow",
                         f"type {to or 'any'} -> {tn or 'any'}")
                return
            else:
                self.add(path, "type_changed", "both", f"type {to} -> {tn}")
                return
        self._enum(so, sn, path)
        for name, upper, fn in (("maximum", True, upper_bound), ("minimum", False, lower_bound)):
            self._bound(path, name, fn(so, to == "integer"), fn(sn, tn == "integer"), upper)
        for kw, upper in _LENGTHS:
            ob = (so[kw], False) if isinstance(so.get(kw), int) else None
            nb = (sn[kw], False) if isinstance(sn.get(kw), int) else None
            self._bound(path, kw, ob, nb, upper)
        self._multiple_of(so.get("multipleOf"), sn.get("multipleOf"), path)
        for kw in ("pattern", "format"):
            a, b = so.get(kw), sn.get(kw)
            if a != b:
                self._condition(path, kw, a, b, None)
        self._array(o, n, path)
        if "object" in (to, tn):
            self._object(o, n, path)
        self._rules(so, sn, path)

    def _condition(self, path: str, kw: str, a: Any, b: Any, absent: Any) -> None:
        """Keyword `kw`, one condition on the document, went from `a` to `b` (`absent`: not there): adding it
        narrows, removing it widens, changing it may do both."""
        if a is absent:
            self.add(path, f"{kw}_added", "narrow", f"{kw} {canonical(b)} added")
        elif b is absent:
            self.add(path, f"{kw}_removed", "widen", f"{kw} {canonical(a)} removed")
        else:
            self.add(path, f"{kw}_changed", "both", f"{kw} {canonical(a)} -> {canonical(b)}")

    def _rules(self, so: Schema, sn: Schema, path: str) -> None:
        """Keywords compared whole, not reasoned about: `propertyNames` and the cross-field rules (`if`/`then`,
        `not`, `dependent*`, and such rules listed in `allOf`). Each is one more condition on the document, so
        adding one narrows, removing one widens, and changing one may do both."""
        for kw in ("propertyNames", *RULE_KEYWORDS):
            a, b = so.get(kw, _MISSING), sn.get(kw, _MISSING)
            if canonical(None if a is _MISSING else a) != canonical(None if b is _MISSING else b):
                self._condition(path, kw, a, b, _MISSING)
        ro = {canonical(r): r for r in so.get("allOf") or []}
        rn = {canonical(r): r for r in sn.get("allOf") or []}
        for text in sorted(rn.keys() - ro.keys()):
            self.add(path, "rule_added", "narrow", f"rule {text} added")
        for text in sorted(ro.keys() - rn.keys()):
            self.add(path, "rule_removed", "widen", f"rule {text} removed")

    def _enum(self, so: Schema, sn: Schema, path: str) -> None:
        eo, en = enum_values(so), enum_values(sn)
        if eo is None and en is None:
            return
        if eo is None:
            self.add(path, "enum_added", "narrow", f"values restricted to {canonical(en)}")
        elif en is None:
            self.add(path, "enum_removed", "widen", f"values no longer restricted to {canonical(eo)}")
        else:
            ko, kn = {canonical(v) for v in eo}, {canonical(v) for v in en}
            for v in eo:
                if canonical(v) not in kn:
                    self.add(path, "enum_value_removed", "narrow", f"value {canonical(v)} removed")
            for v in en:
                if canonical(v) not in ko:
                    self.add(path, "enum_value_added", "widen", f"value {canonical(v)} added")

    def _bound(self, path: str, name: str, old: Bound | None, new: Bound | None, upper: bool) -> None:
        if old == new:
            return
        what = f"{name} {bound_text(old, upper)} -> {bound_text(new, upper)}"
        if old is None:
            self.add(path, f"{name}_added", "narrow", what)
        elif new is None:
            self.add(path, f"{name}_removed", "widen", what)
        else:
            wider = looser(old, new, upper)
            kind = f"{name}_{'raised' if wider == upper else 'lowered'}"
            self.add(path, kind, "widen" if wider else "narrow", what)

    def _multiple_of(self, a: Any, b: Any, path: str) -> None:
        if a == b:
            return
        what = f"multipleOf {a} -> {b}"
        if a is None:
            self.add(path, "multipleOf_added", "narrow", what)
        elif b is None:
            self.add(path, "multipleOf_removed", "widen", what)
        else:
            ratio = Fraction(str(a)) / Fraction(str(b))
            if ratio.denominator == 1:
                self.add(path, "multipleOf_changed", "widen", what)
            elif ratio.numerator == 1:
                self.add(path, "multipleOf_changed", "narrow", what)
            else:
                self.add(path, "multipleOf_changed", "both", what)

    def _array(self, o: Node, n: Node, path: str) -> None:
        so, sn = o.schema, n.schema
        if "items" in so or "items" in sn:
            self.compare(so.get("items", True), f"{o.loc}/items", sn.get("items", True), f"{n.loc}/items",
                         f"{path}[]")
        po, pn = so.get("prefixItems") or [], sn.get("prefixItems") or []
        for i in range(min(len(po), len(pn))):
            self.compare(po[i], f"{o.loc}/prefixItems/{i}", pn[i], f"{n.loc}/prefixItems/{i}", f"{path}[{i}]")
        if len(po) != len(pn):
            self.add(path, "prefixItems_changed", "both", f"tuple positions {len(po)} -> {len(pn)}")
        uo, un = so.get("uniqueItems") is True, sn.get("uniqueItems") is True
        if uo != un:
            self.add(path, "uniqueItems_added" if un else "uniqueItems_removed", "narrow" if un else "widen",
                     "items must now be unique" if un else "items need no longer be unique")

    def _object(self, o: Node, n: Node, path: str) -> None:
        so, sn = o.schema, n.schema
        props_o, props_n = so.get("properties") or {}, sn.get("properties") or {}
        req_o, req_n = set(so.get("required") or []), set(sn.get("required") or [])
        ao, an = additional_properties(so), additional_properties(sn)
        names = dict.fromkeys([*props_o, *sorted(req_o - set(props_o)),
                               *props_n, *sorted(req_n - set(props_n))])
        for name in names:
            p = join_path(path, name)
            in_o, in_n = name in props_o or name in req_o, name in props_n or name in req_n
            if in_o and in_n:
                # A default only matters to payloads that omit the field: old requests, or new responses.
                always_sent = name in (req_o if self.request else req_n)
                if name in req_o and name not in req_n:
                    self.add(p, "property_made_optional", "widen", "property is no longer required")
                elif name in req_n and name not in req_o:
                    self.add(p, "property_made_required", "narrow", "property is now required")
                self.compare(props_o.get(name, True), f"{o.loc}/properties/{name}", props_n.get(name, True),
                             f"{n.loc}/properties/{name}", p, skip_default=always_sent)
            elif in_n:
                self._added(p, name in req_n, ao)
            else:
                self._removed(p, name in req_o, an)
        if isinstance(ao, dict) and isinstance(an, dict):
            self.compare(ao, f"{o.loc}/additionalProperties", an, f"{n.loc}/additionalProperties",
                         f"{path}.*")
        elif ao != an:
            def rank(v: bool | Schema) -> int:
                return 1 if isinstance(v, dict) else 2 if v else 0

            wider = rank(an) > rank(ao)
            self.add(path, "additional_properties_" + ("widened" if wider else "narrowed"),
                     "widen" if wider else "narrow",
                     "additional properties " + ("now allowed" if wider else "now restricted"))

    def _added(self, path: str, required: bool, old_additional: bool | Schema) -> None:
        if self.request:
            if required:
                self.add(path, "required_property_added", "narrow", "new required property",
                         "old clients do not send it")
            else:
                self.add(path, "property_added", "info", "new optional property",
                         "requests that omit it are still valid")
        else:
            self.add(path, "property_added", "extra", "new property" + (" (required)" if required else ""),
                     forbids_extra=old_additional is False)

    def _removed(self, path: str, was_required: bool, new_additional: bool | Schema) -> None:
        if self.request:
            fate = "the new schema rejects it" if new_additional is False else "its meaning is lost"
            self.add(path, "property_removed", "meaning", "property removed",
                     f"old clients still send it and {fate}")
        elif was_required:
            self.add(path, "property_removed", "widen", "required property removed", "old clients expect it")
        else:
            self.add(path, "property_removed", "info", "optional property removed",
                     "old clients already cope with its absence")


def diff_schemas(old: dict[str, Any], new: dict[str, Any], direction: Direction, *,
                 reader: Reader = "tolerant") -> list[Change]:
    """Say which edits old clients survive, so a contract change is reviewed as a decision, not a diff.

    `reader` only matters for responses: a strict reader rejects fields it does not know.
    """
    differ = _Differ(old, new, direction, reader)
    differ.compare(old, "#", new, "#", "$")
    return differ.changes


def diff_openapi(old_doc: dict[str, Any], new_doc: dict[str, Any], *,
                 reader: Reader = "tolerant") -> list[Change]:
    """Compare whole documents the way clients meet them: per operation, what goes in and what comes out."""
    changes: list[Change] = []
    old_ops, new_ops = operations(old_doc), operations(new_doc)
    for key, op in old_ops.items():
        if key not in new_ops:
            changes.append(Change(op.label, "operation_removed", True,
                                  "operation removed; old clients still call it"))
    for key, op in new_ops.items():
        if key not in old_ops:
            changes.append(Change(op.label, "operation_added", False,
                                  "new operation; old clients never call it"))
    for key in [k for k in old_ops if k in new_ops]:
        req = _Differ(old_doc, new_doc, "request", reader)
        _diff_request(req, old_ops[key], new_ops[key])
        resp = _Differ(old_doc, new_doc, "response", reader)
        _diff_responses(resp, old_ops[key], new_ops[key])
        changes += req.changes + resp.changes
    return changes


def _made(what: str, required: bool) -> tuple[str, Effect, str]:
    word = "required" if required else "optional"
    return f"{what.replace(' ', '_')}_made_{word}", "narrow" if required else "widen", f"{what} is now {word}"


def _diff_request(req: _Differ, old: Operation, new: Operation) -> None:
    for name in dict.fromkeys([*old.parameters, *new.parameters]):
        where = f"{new.label} parameter {name}"
        po, pn = old.parameters.get(name), new.parameters.get(name)
        if pn is None:
            req.add(where, "parameter_removed", "meaning", "parameter removed", "old clients still send it")
        elif po is None:
            required = pn.get("required") is True
            req.add(where, "parameter_added", "narrow" if required else "info",
                    f"new {'required' if required else 'optional'} parameter",
                    None if required else "requests that omit it are still valid")
        else:
            if (po.get("required") is True) != (pn.get("required") is True):
                req.add(where, *_made("parameter", pn.get("required") is True))
            req.compare(po.get("schema", True), f"{old.loc}/parameters/{name}", pn.get("schema", True),
                        f"{new.loc}/parameters/{name}", f"{where} $")
    body_o = deref(req.old_root, old.spec.get("requestBody") or {}, f"{old.loc}/requestBody")
    body_n = deref(req.new_root, new.spec.get("requestBody") or {}, f"{new.loc}/requestBody")
    so, sn = json_body(body_o.schema, body_o.loc), json_body(body_n.schema, body_n.loc)
    ro, rn = body_o.schema.get("required") is True, body_n.schema.get("required") is True
    where = f"{new.label} request"
    if so and sn:
        if ro != rn:
            req.add(where, *_made("request body", rn))
        req.compare(so[0], so[1], sn[0], sn[1], f"{where} $")
    elif so:
        req.add(where, "request_body_removed", "meaning", "JSON request body removed",
                "old clients still send it")
    elif sn:
        req.add(where, "request_body_added", "narrow" if rn else "info", "JSON request body added",
                None if rn else "it is optional")


def _diff_responses(resp: _Differ, old: Operation, new: Operation) -> None:
    ro, rn = old.spec.get("responses") or {}, new.spec.get("responses") or {}
    success_kept = any(s.startswith("2") and s in rn for s in ro)
    for status in dict.fromkeys([*ro, *rn]):
        where = f"{new.label} response {status}"
        if status not in rn:
            lost = status.startswith("2") and not success_kept
            resp.add(where, "response_removed", "widen" if lost else "info", "response status removed",
                     "old clients expect a success status it no longer sends" if lost
                     else "the server sends less than before")
        elif status not in ro:
            resp.add(where, "response_added", "extra", "new response status")
        else:
            o = deref(resp.old_root, ro[status], f"{old.loc}/responses/{status}")
            n = deref(resp.new_root, rn[status], f"{new.loc}/responses/{status}")
            so, sn = json_body(o.schema, o.loc), json_body(n.schema, n.loc)
            if so and sn:
                resp.compare(so[0], so[1], sn[0], sn[1], f"{where} $")
            elif so:
                resp.add(where, "response_body_removed", "widen", "JSON response body removed",
                         "old clients parse it")
            elif sn:
                resp.add(where, "response_body_added", "info", "JSON response body added",
                         "old clients did not read a body here")
