"""Every (type, code) pair the source can put in an error envelope, read from the syntax tree of src/sluicegate.

Written by hand over `ast` (no library reads data flow this narrowly). What it follows, literals only:
- `ApiError(type, message, param, code)` and `Rejected(...)` (sluicegate/refusal.py, the same fields) calls: a
  literal, a conditional of literals (`"a" if x else "b"`), an `or` with a literal (`exc.code or "x"`), a local
  assigned from those or from a module-level dict's `.get(key, default)` (the dict's values and the default);
- a `code` (or `type`) that is a parameter of the enclosing function: the literals its callers pass (in the same
  module, or a module that imports it by name), and its default;
- a carrier class (an exception or dataclass with a `code` or `type` field, e.g. `FieldRefusal`, `UnsafeUrl`,
  `EngineOverloaded`, `UpstreamFailure`): the literals passed to its constructor, and its default;
- an envelope written as a dict literal: `{"type": "...", "code": "...", ...}`.
A `code` read from an attribute (`exc.code`) or a `type` that is not a literal must be named in `ATTRIBUTES`
with the carrier it comes from; an unknown one is reported, so a new path cannot slip past the scan.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "sluicegate"

# (module, expression) -> the carrier class whose `code` (or `type`) it reads
ATTRIBUTES = {
    ("api/batch_items.py", "refused.code"): "FieldRefusal",
    ("api/routes/webhooks.py", "exc.code"): "UnsafeUrl",
    ("api/routes/admin_keys.py", "exc.code"): "InvalidKeyField",
    ("api/routes/admin_keys.py", "denied.code"): "NotGranted",
    ("serving/core.py", "exc.code"): "EngineOverloaded",
    ("serving/core.py", "out.error_type"): "UpstreamFailure",
}
CALLS = ("ApiError", "Rejected")  # the error types themselves: what they are given is emitted


@dataclass
class Scan:
    pairs: set[tuple[str, str | None]] = field(default_factory=set)
    unknown: list[str] = field(default_factory=list)  # sites the scan cannot follow


@dataclass
class _Module:
    name: str  # path under src/sluicegate
    tree: ast.Module
    dicts: dict[str, ast.Dict]  # module-level NAME = {...}
    imports: dict[str, str]  # a name imported from another module of ours -> that module's path


def _modules() -> list[_Module]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        dicts = {t.id: n.value for n in tree.body if isinstance(n, ast.Assign | ast.AnnAssign)
                 for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                 if isinstance(t, ast.Name) and isinstance(n.value, ast.Dict)}
        imports = {}
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("sluicegate."):
                for a in n.names:
                    imports[a.asname or a.name] = n.module.removeprefix("sluicegate.").replace(".", "/") + ".py"
        out.append(_Module(str(path.relative_to(SRC)), tree, dicts, imports))
    return out


def _callee(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _arg(call: ast.Call, index: int, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return call.args[index] if index < len(call.args) else None


def _functions(tree: ast.AST) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, list[ast.AST]]]:
    """Every function with its own body's nodes (nested functions excluded from the parent's)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            own: list[ast.AST] = []
            stack: list[ast.AST] = list(node.body)
            while stack:
                n = stack.pop()
                own.append(n)
                if not isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                    stack.extend(ast.iter_child_nodes(n))
            yield node, own


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> list[str]:
    names = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
    return names[1:] if names and names[0] in ("self", "cls") else names


def _default(fn: ast.FunctionDef | ast.AsyncFunctionDef, param: str) -> ast.expr | None:
    positional = [*fn.args.posonlyargs, *fn.args.args]
    offset = len(positional) - len(fn.args.defaults)
    for i, a in enumerate(positional):
        if a.arg == param and i >= offset:
            return fn.args.defaults[i - offset]
    for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults, strict=True):
        if a.arg == param:
            return d
    return None


class _Values:
    """The literal values an expression can take, and what it depends on that is not a literal."""

    def __init__(self, mod: _Module, assigns: dict[str, list[ast.expr]], params: list[str]) -> None:
        self.mod, self.assigns, self.params = mod, assigns, params

    def of(self, e: ast.expr | None, seen: frozenset[str] = frozenset()) -> tuple[set[str | None], set[str]]:
        """(literals, open ends): an open end is `param:NAME` or `attr:EXPR`."""
        if e is None or (isinstance(e, ast.Constant) and e.value is None):
            return {None}, set()
        if isinstance(e, ast.Constant) and isinstance(e.value, str):
            return {e.value}, set()
        if isinstance(e, ast.IfExp):
            return self._union(self.of(e.body, seen), self.of(e.orelse, seen))
        if isinstance(e, ast.BoolOp):
            out: tuple[set[str | None], set[str]] = (set(), set())
            for v in e.values:
                out = self._union(out, self.of(v, seen))
            return out
        if isinstance(e, ast.Name) and e.id in self.assigns and e.id not in seen:
            out = (set(), set())
            for v in self.assigns[e.id]:
                out = self._union(out, self.of(v, seen | {e.id}))
            return out
        if isinstance(e, ast.Name) and e.id in self.params:
            return set(), {f"param:{e.id}"}
        if (isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "get"
                and isinstance(e.func.value, ast.Name) and e.func.value.id in self.mod.dicts):
            values = {v.value for v in self.mod.dicts[e.func.value.id].values
                      if isinstance(v, ast.Constant) and isinstance(v.value, str)}
            lits, ends = self.of(e.args[1] if len(e.args) > 1 else None, seen)
            return values | lits, ends
        return set(), {f"attr:{ast.unparse(e)}"}

    @staticmethod
    def _union(a: tuple[set[str | None], set[str]], b: tuple[set[str | None], set[str]]) -> tuple[
            set[str | None], set[str]]:
        return a[0] | b[0], a[1] | b[1]


def _carriers(mods: list[_Module]) -> dict[str, dict[str, set[str | None]]]:
    """class name -> {"code"/"type": the literals its constructor is given, its default included}."""
    shapes: dict[str, tuple[str, list[str], dict[str, ast.expr | None]]] = {}  # class -> (module, fields, defaults)
    for m in mods:
        for node in ast.walk(m.tree):
            if not isinstance(node, ast.ClassDef):
                continue
            init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
            if init is not None:
                names, defaults = _params(init), {p: _default(init, p) for p in _params(init)}
            else:
                anns = [n for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)]
                names = [n.target.id for n in anns if isinstance(n.target, ast.Name)]
                defaults = {n.target.id: n.value for n in anns if isinstance(n.target, ast.Name)}
            if ("code" in names or "type" in names) and node.name not in CALLS:
                shapes[node.name] = (m.name, names, defaults)
    out: dict[str, dict[str, set[str | None]]] = defaultdict(lambda: defaultdict(set))
    for cls, (_, names, defaults) in shapes.items():
        for f in ("code", "type"):
            if f in names and isinstance(defaults.get(f), ast.Constant):
                out[cls][f].add(defaults[f].value)  # type: ignore[union-attr]
    for m in mods:
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Call) and _callee(node) in shapes:
                cls = _callee(node)
                assert cls is not None
                names = shapes[cls][1]
                for f in ("code", "type"):
                    if f in names:
                        arg = _arg(node, names.index(f), f)
                        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                            out[cls][f].add(arg.value)
    return out


def scan() -> Scan:
    mods = _modules()
    carriers = _carriers(mods)
    result = Scan()
    pending: list[tuple[_Module, str, str, set[str | None], str]] = []  # (module, function, param, types, site)
    for m in mods:
        for fn, own in _functions(m.tree):
            assigns: dict[str, list[ast.expr]] = defaultdict(list)
            for n in own:
                if isinstance(n, ast.Assign):
                    for t in n.targets:
                        if isinstance(t, ast.Name):
                            assigns[t.id].append(n.value)
            values = _Values(m, assigns, _params(fn))
            for n in own:
                if isinstance(n, ast.Call) and _callee(n) in CALLS:
                    _record(result, m, fn, n, values, carriers, pending)
                if isinstance(n, ast.Dict):
                    keys = {k.value: v for k, v in zip(n.keys, n.values, strict=True) if isinstance(k, ast.Constant)}
                    t, c = keys.get("type"), keys.get("code")
                    if isinstance(t, ast.Constant) and isinstance(c, ast.Constant) and "message" in keys:
                        result.pairs.add((t.value, c.value))
    for m, fname, param, types, site in pending:
        codes = _callers(mods, m, fname, param)
        if codes is None:
            result.unknown.append(f"{site}: {fname}({param}=...) is called with something that is not a literal")
            continue
        result.pairs |= {(t, c) for t in types if t is not None for c in codes}
    return result


def _record(result: Scan, m: _Module, fn: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call, values: _Values,
            carriers: dict[str, dict[str, set[str | None]]],
            pending: list[tuple[_Module, str, str, set[str | None], str]]) -> None:
    site = f"{m.name}:{call.lineno}"
    types, type_ends = values.of(_arg(call, 0, "type"))
    codes, code_ends = values.of(_arg(call, 3, "code"))
    for end in type_ends:
        cls = ATTRIBUTES.get((m.name, end.removeprefix("attr:")))
        if cls is None:
            result.unknown.append(f"{site}: type={end}")
        else:
            types |= carriers[cls]["type"]
    for end in code_ends:
        if end.startswith("param:"):
            pending.append((m, fn.name, end.removeprefix("param:"), types, site))
            continue
        cls = ATTRIBUTES.get((m.name, end.removeprefix("attr:")))
        if cls is None:
            result.unknown.append(f"{site}: code={end}")
        else:
            codes |= carriers[cls]["code"]
    result.pairs |= {(t, c) for t in types if t is not None for c in codes}


def _callers(mods: list[_Module], home: _Module, fname: str, param: str) -> set[str | None] | None:
    """The literals given to `fname`'s `param` by every caller, its default included; None when one is not."""
    fn = next(f for f, _ in _functions(home.tree) if f.name == fname)
    index = _params(fn).index(param)
    found: set[str | None] = set()
    default = _default(fn, param)
    if isinstance(default, ast.Constant):
        found.add(default.value)
    for m in mods:
        if m is not home and m.imports.get(fname) != home.name:
            continue
        for node in ast.walk(m.tree):
            if isinstance(node, ast.Call) and _callee(node) == fname:
                arg = _arg(node, index, param)
                if arg is None and default is not None:
                    continue
                if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
                    return None
                found.add(arg.value)
    return found
