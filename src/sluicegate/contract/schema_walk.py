"""Normalisation for the schema differ: `$ref` resolution, nullable folding, union branches, bounds.

Pydantic, FastAPI and hand-written OpenAPI spell the same constraint several ways (`anyOf` with a null
branch, `type: [X, "null"]`, OpenAPI 3.0 `nullable: true`; `maximum` with boolean or numeric
`exclusiveMaximum`; `$ref` with sibling keywords or wrapped in a one-element `allOf`). The differ compares
meaning, so everything here turns those spellings into one shape first.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

Schema = dict[str, Any]

# Keywords that describe a schema without constraining what it accepts.
ANNOTATIONS = frozenset(
    {"title", "description", "examples", "example", "default", "deprecated", "readOnly", "writeOnly",
     "$comment", "discriminator", "externalDocs", "xml", "nullable"}
)
_MAX_DEPTH = 64
# Keys next to a `$ref` that neither constrain nor describe the field (a root's `$defs` rides along).
_NOT_SIBLINGS = frozenset(
    {"$ref", "$defs", "definitions", "$schema", "$id", "title", "description", "$comment"}
)
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SchemaError(ValueError):
    """A schema the differ cannot read (a dangling or non-local `$ref`, a reference loop)."""


@dataclass(frozen=True)
class Node:
    """A schema plus where it lives; two nodes with the same `loc` compare identically, which stops cycles."""

    schema: Schema
    loc: str
    ref: str | None = None


def resolve_pointer(root: Any, ref: str) -> Any:
    """Follow a local JSON pointer; remote references would make the result depend on the network."""
    if not ref.startswith("#"):
        raise SchemaError(f"only local references are supported, got {ref!r}")
    cur = root
    for raw in [p for p in ref[1:].split("/") if p] if ref not in ("#", "#/") else []:
        key = unquote(raw).replace("~1", "/").replace("~0", "~")
        if isinstance(cur, list) and key.isdigit() and int(key) < len(cur):
            cur = cur[int(key)]
        elif isinstance(cur, dict) and key in cur:
            cur = cur[key]
        else:
            raise SchemaError(f"unresolvable reference {ref!r}")
    return cur


def as_schema(value: Any) -> Schema:
    """Booleans are schemas too: `true` accepts anything, `false` nothing."""
    if value is True:
        return {}
    if value is False:
        return {"not": {}}
    if isinstance(value, dict):
        return value
    raise SchemaError(f"expected a schema object, got {type(value).__name__}")


def deref(root: Any, value: Any, loc: str, depth: int = 0) -> Node:
    """Follow `$ref` chains and fold `allOf`, keeping outer sibling keywords (a field's own default wins)."""
    if depth > _MAX_DEPTH:
        raise SchemaError(f"schema nested too deeply at {loc}")
    schema, ref, seen = as_schema(value), None, set()
    outer: Schema = {}
    while "$ref" in schema:
        target = schema["$ref"]
        if not isinstance(target, str) or target in seen:
            raise SchemaError(f"reference loop through {target!r}")
        seen.add(target)
        siblings = {k: v for k, v in schema.items() if k not in _NOT_SIBLINGS}
        loc = f"{loc}->{target}" if siblings else target
        outer = {**siblings, **outer}
        schema, ref = as_schema(resolve_pointer(root, target)), target
    if isinstance(schema.get("allOf"), list) and any(not is_rule(p) for p in schema["allOf"]):
        merged: Schema = {k: v for k, v in schema.items() if k != "allOf"}
        rules = [p for p in schema["allOf"] if is_rule(p)]
        for i, part in enumerate(schema["allOf"]):
            if is_rule(part):
                continue
            sub = deref(root, part, f"{loc}/allOf/{i}", depth + 1)
            ref = ref or sub.ref
            merged = _merge(sub.schema, merged)
        if rules:
            merged["allOf"] = rules
        schema, loc = merged, f"{loc}/allOf"
    if outer:
        schema = {**schema, **outer}
    return Node(schema, loc, ref)


RULE_KEYWORDS = ("if", "then", "else", "not", "dependentRequired", "dependentSchemas")


def is_rule(part: Any) -> bool:
    """An `allOf` member that is a cross-field rule (`if`/`then`, `not`, `dependent*`), not a schema to fold:
    it stays in `allOf`, and the differ compares such rules whole."""
    return isinstance(part, dict) and bool(part) and all(k in RULE_KEYWORDS for k in part)


def _merge(base: Schema, top: Schema) -> Schema:
    out = {**base, **top}
    if "properties" in base or "properties" in top:
        out["properties"] = {**base.get("properties", {}), **top.get("properties", {})}
    if "required" in base or "required" in top:
        out["required"] = sorted({*base.get("required", []), *top.get("required", [])})
    return out


def split_nullable(root: Any, node: Node, depth: int = 0) -> tuple[bool, list[Node]]:
    """Fold every spelling of "may be null" into a flag, leaving the non-null union branches."""
    s = node.schema
    nullable = s.get("nullable") is True
    for kw in ("anyOf", "oneOf"):
        if isinstance(s.get(kw), list):
            out: list[Node] = []
            for i, sub in enumerate(s[kw]):
                child = deref(root, sub, f"{node.loc}/{kw}/{i}", depth + 1)
                n, branches = split_nullable(root, child, depth + 1)
                nullable |= n
                out.extend(branches)
            return nullable, out
    t = s.get("type")
    if isinstance(t, list):
        types = [x for x in t if x != "null"]
        nullable |= "null" in t
        if len(types) == 1:
            return nullable, [Node({**s, "type": types[0]}, node.loc, node.ref)]
        return nullable, [Node({**s, "type": x}, f"{node.loc}/type={x}", node.ref) for x in types]
    if t == "null" or ("const" in s and s["const"] is None):
        return True, []
    if s == {"not": {}}:  # `false`: accepts nothing, so it has no branches at all
        return nullable, []
    enum = s.get("enum")
    if isinstance(enum, list) and None in enum:
        rest = [v for v in enum if v is not None]
        return True, [Node({**s, "enum": rest}, node.loc, node.ref)] if rest else []
    return nullable, [node]


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def enum_values(s: Schema) -> list[Any] | None:
    """`const` is a one-value enum; comparing them as one keyword catches const <-> enum rewrites."""
    if isinstance(s.get("enum"), list):
        return list(s["enum"])
    if "const" in s:
        return [s["const"]]
    return None


def json_type(s: Schema) -> str | None:
    """The one JSON type a non-null branch accepts, inferred where `type` is implicit; None means any."""
    t = s.get("type")
    if isinstance(t, str):
        return t
    if any(k in s for k in ("properties", "additionalProperties", "required")):
        return "object"
    if "items" in s or "prefixItems" in s:
        return "array"
    values = enum_values(s)
    if values:
        types = {_type_of(v) for v in values}
        if types == {"integer", "number"}:
            return "number"
        if len(types) == 1:
            return types.pop()
    return None


def is_unconstrained(s: Schema) -> bool:
    return all(k in ANNOTATIONS for k in s)


def canonical(value: Any) -> str:
    """A hashable, order-insensitive spelling of a JSON value (for enum and default comparison)."""
    return json.dumps(_integral(value), sort_keys=True, separators=(",", ":"))


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral(v) for v in value]
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    return value


def branch_key(node: Node, tag: str | None) -> str:
    """How union branches are paired across versions: discriminator tag, then `$ref` name, then type."""
    s = node.schema
    if tag:
        prop = s.get("properties", {}).get(tag)
        values = enum_values(prop) if isinstance(prop, dict) else None
        if values and len(values) == 1:
            return f"{tag}={canonical(values[0])}"
    if node.ref:
        return node.ref.rsplit("/", 1)[-1]
    if "const" in s:
        return f"const {canonical(s['const'])}"
    return json_type(s) or "any"


def type_family(node: Node) -> str:
    t = json_type(node.schema) or "any"
    return "number" if t == "integer" else t


Bound = tuple[float, bool]  # (value, exclusive)


def upper_bound(s: Schema, integer: bool) -> Bound | None:
    """The tightest upper limit, in either draft's spelling; integers normalise `< 10` to `<= 9`."""
    return _bound(s, "maximum", "exclusiveMaximum", upper=True, integer=integer)


def lower_bound(s: Schema, integer: bool) -> Bound | None:
    return _bound(s, "minimum", "exclusiveMinimum", upper=False, integer=integer)


def _bound(s: Schema, incl: str, excl: str, *, upper: bool, integer: bool) -> Bound | None:
    cands: list[Bound] = []
    value, flag = s.get(incl), s.get(excl)
    if isinstance(flag, bool):
        if isinstance(value, int | float):
            cands.append((value, flag))
    else:
        if isinstance(value, int | float):
            cands.append((value, False))
        if isinstance(flag, int | float):
            cands.append((flag, True))
    if not cands:
        return None
    if upper:
        val, exclusive = min(cands, key=lambda c: (c[0], not c[1]))
    else:
        val, exclusive = max(cands, key=lambda c: (c[0], c[1]))
    if integer and math.isfinite(val):
        if upper:
            return (math.ceil(val) - 1 if exclusive else math.floor(val), False)
        return (math.floor(val) + 1 if exclusive else math.ceil(val), False)
    return (val, exclusive)


def bound_text(bound: Bound | None, upper: bool) -> str:
    if bound is None:
        return "none"
    op = ("<" if bound[1] else "<=") if upper else (">" if bound[1] else ">=")
    return f"{op} {bound[0]}"


def looser(old: Bound, new: Bound, upper: bool) -> bool:
    """True when `new` admits a value `old` did not."""
    if old[0] != new[0]:
        return new[0] > old[0] if upper else new[0] < old[0]
    return old[1] and not new[1]


_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")


@dataclass(frozen=True)
class Operation:
    """One OpenAPI operation with its parameters merged from the path item (operation-level ones win)."""

    label: str
    loc: str
    spec: Schema
    parameters: dict[str, Schema]


def operations(doc: Any) -> dict[str, Operation]:
    """Operations keyed by method and path template with parameter names blanked, so renames still match."""
    out: dict[str, Operation] = {}
    paths = doc.get("paths") if isinstance(doc, dict) else None
    for path, raw in (paths if isinstance(paths, dict) else {}).items():
        item = deref(doc, raw, f"#/paths/{path}").schema
        for method in _METHODS:
            spec = item.get(method)
            if not isinstance(spec, dict):
                continue
            params: dict[str, Schema] = {}
            for p in [*(item.get("parameters") or []), *(spec.get("parameters") or [])]:
                param = deref(doc, p, "#").schema
                params[f"{param.get('in')}.{param.get('name')}"] = param
            key = f"{method.upper()} {re.sub(r'{[^}]*}', '{}', path)}"
            out[key] = Operation(f"{method.upper()} {path}", f"#/paths/{path}/{method}", spec, params)
    return out


def json_body(holder: Schema, loc: str) -> tuple[Any, str] | None:
    """The schema of a request body's or response's JSON media type, if it has one."""
    content = holder.get("content")
    if not isinstance(content, dict):
        return None
    for media in sorted(content, key=lambda m: m != "application/json"):
        is_json = media.split(";")[0].strip() == "application/json" or media.endswith("+json")
        if is_json and isinstance(content[media], dict) and "schema" in content[media]:
            return content[media]["schema"], f"{loc}/content/{media}/schema"
    return None


def join_path(path: str, name: str) -> str:
    return f"{path}.{name}" if _IDENT.match(name) else f"{path}[{canonical(name)}]"


def additional_properties(s: Schema) -> bool | Schema:
    value = s.get("additionalProperties", True)
    if value is True or (isinstance(value, dict) and is_unconstrained(value)):
        return True
    if value is False or value == {"not": {}}:
        return False
    return as_schema(value)


def discriminator_tag(s: Schema) -> str | None:
    disc = s.get("discriminator")
    name = disc.get("propertyName") if isinstance(disc, dict) else None
    return name if isinstance(name, str) else None


def match_branches(old: list[Node], new: list[Node],
                   tag: str | None) -> tuple[list[tuple[Node, Node]], list[Node], list[Node]]:
    """Pair union branches by key; untagged leftovers pair by type family, then one-to-one."""
    pairs: list[tuple[Node, Node]] = []
    removed: list[Node] = []
    left = list(new)
    for o in old:
        hit = next((n for n in left if branch_key(n, tag) == branch_key(o, tag)), None)
        if hit is None:
            removed.append(o)
        else:
            pairs.append((o, hit))
            left = [n for n in left if n is not hit]
    if tag is None:
        for o in list(removed):
            olds = [x for x in removed if type_family(x) == type_family(o)]
            news = [x for x in left if type_family(x) == type_family(o)]
            if len(olds) == 1 and len(news) == 1:
                pairs.append((o, news[0]))
                removed = [x for x in removed if x is not o]
                left = [x for x in left if x is not news[0]]
        if len(removed) == 1 and len(left) == 1:
            pairs.append((removed.pop(), left.pop()))
    return pairs, removed, left
