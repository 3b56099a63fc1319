"""The spec (what headers don't say) and the merge of spec and parsed headers into the IR.

The IR is a plain JSON document. Everything an emitter needs is in it: the C
declarations as parsed, and per function the Python name, each parameter's role
(roles.py: the names and attributes a spec may give), whether the GIL is released,
the success statuses, and the version that first exported it. Emitters never read the
spec or the headers; they read the IR as typed objects (ir_types.py).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import roles
from ir_types import CType, Library, Pointer, StructType, ctype, is_char_ptr, is_void
from since import since_table

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent
# The generated package; its _support/<lib>.pxi are the hand-written Cython its modules include.
BINDINGS = ROOT.parent / "src" / "mpbind" / "bindings"
IR_FORMAT = 1

def camel_to_snake(name: str) -> str:
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    # a lower-case letter before a capital, or a digit before a capitalised word;
    # "C2C" stays one word (cufftExecC2C -> exec_c2c)
    s = re.sub(r"([a-z])([A-Z])", r"\1_\2", s)
    s = re.sub(r"([0-9])([A-Z][a-z])", r"\1_\2", s)
    return s.lower()


def enum_class_name(c_name: str, prefixes: tuple[str, ...]) -> str:
    name = c_name
    if name.endswith("_t"):
        name = name[:-2]
    for prefix in sorted(prefixes, key=len, reverse=True):
        if name.lower().startswith(prefix.lower()):
            name = name[len(prefix):]
            break
    parts = [p for p in re.split(r"_", name) if p]
    return "".join(p[0].upper() + p[1:] for p in parts)


def _words(name: str) -> list[str]:
    if "_" in name:
        return [w for w in name.split("_") if w]
    return re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z0-9]+|[A-Z0-9]+", name)


def enum_member_names(values: list[str], prefix: str) -> list[str]:
    """Strip the library prefix and the longest common word prefix; UPPER_SNAKE."""
    stripped = []
    for v in values:
        s = v
        # camelCase members (ncclSum) lose the library prefix here; UPPER_SNAKE ones
        # (CUBLASMP_..._BLK128x128_FP32, not all upper case) lose their first word below.
        if s.lower().startswith(prefix.lower()) and not s.isupper() and not s[len(prefix):].startswith("_"):
            s = s[len(prefix):]
        stripped.append(s)
    words = [_words(s) for s in stripped]
    # UPPER_SNAKE members start with a library word (NCCL_, NVSHMEMX_, NVSHMEMI_ ...).
    if all(w and w[0].upper().startswith(prefix.upper()) and len(w) > 1 for w in words):
        words = [w[1:] for w in words]
    common = 0
    if len(words) > 1:
        while all(len(w) > common + 1 for w in words) and len({w[common] for w in words}) == 1:
            common += 1
    out = []
    for w in words:
        name = "_".join(x.upper() for x in w[common:])
        if not name or name[0].isdigit():
            name = "_".join(x.upper() for x in w[max(common - 1, 0):])
        out.append(name)
    return out


@dataclass
class Spec:
    name: str
    pretty: str
    wheel: str
    include_subdir: str
    binary: str
    headers: list[str]
    language: str
    defines: list[str]
    prefixes: tuple[str, ...]
    ignore_patterns: list[str]
    constant_patterns: list[str]
    handles: dict[str, str]
    foreign_handles: dict[str, str]
    initializers: dict[str, str]
    status: dict[str, Any]
    version: dict[str, Any]
    gil_keep: set[str]
    gil_keep_matching: list[str]  # regular expressions: whole families that keep the GIL
    functions: dict[str, dict[str, Any]]
    excluded: dict[str, str]
    enums: dict[str, dict[str, Any]]
    structs: dict[str, dict[str, Any]]
    since: dict[str, str]
    value_types: dict[str, str]
    python_prefixes: dict[str, str]
    family_types: dict[str, str]
    inline: dict[str, dict[str, Any]]
    support: str  # the hand-written support file the module includes (relative to BINDINGS), or ""
    scalar_pointers: str
    device_only_patterns: list[str]
    foreign_enums: list[str]
    extra_includes: list[list[str]]
    typed_attributes: dict[str, dict[str, str]]
    init: dict[str, Any]

    @classmethod
    def load(cls, name: str) -> Spec:
        path = ROOT / "specs" / f"{name}.toml"
        d = tomllib.loads(path.read_text())
        lib = d["library"]
        return cls(
            name=lib["name"],
            pretty=lib["pretty"],
            wheel=lib["wheel"],
            include_subdir=lib["include_subdir"],
            binary=lib["binary"],
            headers=lib["headers"],
            language=lib.get("language", "c"),
            defines=lib.get("defines", []),
            prefixes=tuple(lib["prefixes"]),
            ignore_patterns=lib.get("ignore_patterns", []),
            constant_patterns=lib.get("constant_patterns", []),
            handles=d.get("handles", {}),
            foreign_handles=d.get("foreign_handles", {}),
            initializers=d.get("initializers", {}),
            status=d["status"],
            version=d["version"],
            gil_keep=set(d.get("gil", {}).get("keep", [])),
            gil_keep_matching=d.get("gil", {}).get("keep_matching", []),
            functions=d.get("functions", {}),
            excluded=d.get("excluded", {}),
            enums=d.get("enums", {}),
            structs=d.get("structs", {}),
            # derived from the exports of every release (codegen/symbols/<lib>.json)
            since=since_table(lib["name"]),
            value_types=d.get("value_types", {}),
            python_prefixes=lib.get("python_prefixes", {f"{lib['prefixes'][0]}": ""}),
            family_types=d.get("families", {}).get("types", {}),
            inline=d.get("inline", {}),
            support=f"_support/{lib['name']}.pxi" if (BINDINGS / "_support" / f"{lib['name']}.pxi").is_file() else "",
            scalar_pointers=lib.get("scalar_pointers", "out"),
            device_only_patterns=lib.get("device_only_patterns", []),
            foreign_enums=lib.get("foreign_enums", []),
            extra_includes=lib.get("extra_includes", []),
            typed_attributes=d.get("typed_attributes", {}),
            init=d.get("init", {}),
        )

    def python_name(self, c_name: str) -> str:
        for pre in sorted(self.python_prefixes, key=len, reverse=True):
            if c_name.startswith(pre):
                return self.python_prefixes[pre] + camel_to_snake(c_name[len(pre):].lstrip("_"))
        raise ValueError(f"{c_name} has none of the prefixes {list(self.python_prefixes)}")


def default_role(t: CType, scalar_pointers: str = "out") -> str:
    """A pointer parameter is an output unless the spec says otherwise.

    scalar_pointers="address": a library (NVSHMEM) whose non-const pointers to
    scalars are buffers (dest, sig_addr), its outputs listed in the spec.
    """
    if not isinstance(t, Pointer):
        return "in"
    p = t.pointee
    if p.const:
        return "in"
    if is_void(p):
        return "in"  # a device or host address
    if scalar_pointers == "address" and not isinstance(p, StructType):
        return "in"
    return "out"


def build_ir(spec: Spec, parsed: dict[str, Any], version: str, header_sha: dict[str, str],
             exports: set[str]) -> dict[str, Any]:
    """Merge the parsed headers and the spec into the IR."""
    struct_names = {s["name"] for s in parsed["structs"]}
    _void_unknown_pointees(parsed, struct_names)
    known = {f["name"] for f in parsed["functions"]}
    init_needs = _init_needs(spec, parsed)
    for name in list(spec.functions) + list(spec.excluded) + list(spec.gil_keep) + list(spec.inline) + \
            list(init_needs):
        if name not in known and name not in spec.excluded:
            raise ValueError(f"spec names {name}, which the pinned headers do not declare")
    functions = [_function(spec, f, exports, struct_names, init_needs) for f in parsed["functions"]]
    pynames: dict[str, str] = {}
    for f in functions:
        if "python" in f:
            if f["python"] in pynames:
                raise ValueError(f"{f['name']} and {pynames[f['python']]} both map to {f['python']}")
            pynames[f["python"]] = f["name"]
    families = _families(spec, functions, pynames)
    _check_support(spec, [f["python"] for f in functions if "inline_body" in f])
    ir = {
        "format": IR_FORMAT,
        "library": spec.name,
        "pretty": spec.pretty,
        "prefix": spec.prefixes[0],
        "wheel": spec.wheel,
        "version": version,
        "headers": header_sha,
        "status": {**spec.status, "enum": spec.status["type"]},
        "version_function": spec.version,
        "handles": spec.handles,
        "handle_tags": parsed["handle_tags"],
        "foreign_handles": spec.foreign_handles,
        "aliases": parsed["aliases"],
        "enums": [_enum(spec, e) for e in parsed["enums"]],
        "structs": [_struct(spec, s) for s in parsed["structs"]],
        "constants": parsed["constants"],
        "functions": functions,
        "families": families,
        "support": spec.support,
        "typed_attributes": spec.typed_attributes,
        "prefixes": list(spec.prefixes),
        "family_types": spec.family_types,
        "exports": sorted(exports),
        "undeclared": _undeclared(spec, parsed, exports),
    }
    if spec.init:
        ir["init_check"] = {k: spec.init[k] for k in ("function", "enum", "error")}
    _check_roles(ir)
    _check_coverage(ir)
    return ir


def _undeclared(spec: Spec, parsed: dict[str, Any], exports: set[str]) -> list[dict[str, Any]]:
    """The exported functions no parsed header declares, each with the header whose text declares
    it (parsed["elsewhere"], from parse.declaring_headers; None: none) and why it is not bound
    (the spec's [excluded] reason, else where it is declared)."""
    binary = Path(spec.binary).name
    reached = set(parsed["included"])
    out = []
    for name in sorted(exports - {f["name"] for f in parsed["functions"]}):
        header = parsed["elsewhere"][name]
        if name in spec.excluded:
            why = spec.excluded[name]
        elif header is None:
            why = f"exported by {binary}, but declared in no public header (internal)"
        elif header in reached:
            why = f"exported by {binary}; {header} declares it only under a preprocessor condition " \
                  "the parsed host configuration does not meet"
        else:
            why = f"exported by {binary}; declared in {header}, which the parsed headers do not include"
        out.append({"name": name, "header": header, "excluded": why})
    return out


def _check_coverage(ir: dict[str, Any]) -> None:
    """Every declared function is bound or excluded with a reason; every exported one is declared
    or listed as undeclared: the audit (python -m mpbind coverage) leaves nothing out."""
    unaccounted = [f["name"] for f in ir["functions"] if not f.get("python") and not f.get("excluded")]
    listed = {f["name"] for f in ir["functions"]} | {u["name"] for u in ir["undeclared"]}
    unaccounted += sorted(set(ir["exports"]) - listed)
    if unaccounted:
        raise ValueError(f"{ir['library']}: neither bound nor excluded with a reason: {unaccounted}")


def _exclusion(spec: Spec, f: dict[str, Any], exports: set[str]) -> str | None:
    """Why a declared function is not bound, or None."""
    name = f["name"]
    reason = spec.excluded.get(name)
    if reason is None and f.get("device_only"):
        reason = "device-only (__device__): not callable from the host"
    if reason is None and any(re.search(p, name) for p in spec.device_only_patterns) and name not in exports:
        reason = "device-only (thread-group variant): not callable from the host"
    if reason is None and name not in spec.inline and (f["inline"] or name not in exports):
        reason = f"not exported by {Path(spec.binary).name} (header-inline or device-only)"
    return reason


def _init_needs(spec: Spec, parsed: dict[str, Any]) -> dict[str, str | None]:
    """The init status each function listed under [init.needs] needs (None: callable at any
    status, the enum's lowest member); the functions not listed need [init] default."""
    if not spec.init:
        return {}
    enum = next((e for e in parsed["enums"] if e["name"] == spec.init["enum"]), None)
    if enum is None:
        raise ValueError(f"[init] enum {spec.init['enum']} is not declared by the headers")
    members = dict(enum["values"])
    lowest = min(members, key=members.__getitem__)
    needs: dict[str, str | None] = {}
    for status in [spec.init["default"], *spec.init.get("needs", {})]:
        if status not in members:
            raise ValueError(f"[init] {status} is not a member of {enum['name']}")
    for status, names in spec.init.get("needs", {}).items():
        for name in names:
            if name in needs:
                raise ValueError(f"[init.needs] lists {name} twice")
            needs[name] = None if status == lowest else status
    if needs.get(spec.init["function"], "") is not None:
        raise ValueError(f"[init] {spec.init['function']} must be callable at any status ({lowest})")
    return needs


def _function(spec: Spec, f: dict[str, Any], exports: set[str], struct_names: set[str],
              init_needs: dict[str, str | None]) -> dict[str, Any]:
    """The IR entry of one declared function: why it is excluded, or how Python calls it."""
    name = f["name"]
    fs = spec.functions.get(name, {})
    entry: dict[str, Any] = dict(f)
    reason = _exclusion(spec, f, exports)
    if reason is not None:
        entry["excluded"] = reason
        return entry
    # A reproduced static inline function needs what its body calls.
    since_of = spec.inline[name]["uses"] if name in spec.inline else name
    if since_of not in spec.since:
        raise ValueError(f"spec has no 'since' version for {since_of}")
    entry["since"] = spec.since[since_of]
    entry["python"] = fs.get("python", spec.python_name(name))
    keeps = name in spec.gil_keep or any(re.fullmatch(p, name) for p in spec.gil_keep_matching)
    entry["gil"] = "keep" if keeps else "release"
    entry["success"] = _success(spec, f)
    if name in spec.status.get("null_error", {}):
        entry["null_error"] = [camel_to_snake(n) for n in spec.status["null_error"][name]]
    if name in spec.inline:
        # static inline in the header: the support file defines it over exported entry points.
        entry["inline_body"] = spec.inline[name]
    if spec.init and (needs := init_needs.get(name, spec.init["default"])) is not None:
        entry["needs_init"] = needs
    entry["params"] = _params(spec, f, fs.get("params", {}), struct_names)
    return entry


def _params(spec: Spec, f: dict[str, Any], pspec: dict[str, Any], struct_names: set[str]) -> list[dict[str, Any]]:
    """Each parameter with its role (the spec's, or the default for its C type) and attributes."""
    for pname in pspec:
        if pname not in {p["name"] for p in f["params"]}:
            raise ValueError(f"spec for {f['name']} names unknown parameter {pname}")
    params = []
    for p in f["params"]:
        ps = dict(pspec.get(p["name"], {}))
        t = ctype(p["type"])
        role = ps.pop("role", default_role(t, spec.scalar_pointers))
        roles.check(role, ps, f"{f['name']}.{p['name']}")
        if role in ("in", "inout") and isinstance(t, Pointer) and not is_char_ptr(t) and not ps.get("address"):
            pointee = t.pointee
            if isinstance(pointee, StructType) and pointee.name in struct_names:
                ps.setdefault("struct", pointee.name)
        if spec.scalar_pointers == "address" and role == "in" and is_char_ptr(t):
            ps.setdefault("address", True)  # a char buffer (nvshmem_char_put), not a string
        params.append({**p, "role": role, "python": camel_to_snake(p["name"]), **ps})
    # Lengths of input arrays come from the Python sequence.
    for p in params:
        if p["role"] == "in_array" and not p.get("explicit_length"):
            for q in params:
                if q["name"] == p["length"]:
                    q["role"] = "length"
                    q["length_of"] = p["name"]
    return params


def _enum(spec: Spec, e: dict[str, Any]) -> dict[str, Any]:
    es = spec.enums.get(e["name"], {})
    names = [v[0] for v in e["values"]]
    py = es.get("members") or enum_member_names(names, spec.name)
    if es.get("strip"):
        py = [m[len(es["strip"]):] if m.startswith(es["strip"]) else m for m in py]
    if len(set(py)) != len(py):
        # Shortened names collide (e.g. an enum listing both RDXN_OP_AND and
        # NVSHMEMI_AND): keep the C names.
        py = names
    if len(set(py)) != len(py):
        raise ValueError(f"enum {e['name']}: Python member names collide: {py}")
    return {**e, "python": es.get("python", enum_class_name(e["name"], spec.prefixes)),
            "members": [[c, p, v] for (c, v), p in zip(e["values"], py, strict=True)]}


def _struct(spec: Spec, s: dict[str, Any]) -> dict[str, Any]:
    if not spec.structs.get(s["name"], {}).get("python") and \
            not enum_class_name(s["name"], spec.prefixes)[:1].isalpha():
        raise ValueError(f"struct {s['name']} needs a Python name in the spec")
    ss = spec.structs.get(s["name"], {})
    entry = {**s, "python": ss.get("python", enum_class_name(s["name"], spec.prefixes))}
    if ss.get("kind"):
        entry["kind"] = ss["kind"]
    if ss.get("expose"):
        entry["expose"] = True  # emitted even though no function signature names it
    if ss.get("opaque"):
        entry.pop("fields", None)
        entry["opaque"] = ss["opaque"]
    return entry


def _check_support(spec: Spec, inline: list[str]) -> None:
    """The support file defines every static inline function the spec reproduces."""
    if not inline:
        return
    if not spec.support:
        raise ValueError(f"{spec.name}: {inline} are defined in src/mpbind/bindings/_support/{spec.name}.pxi, "
                         "which is missing")
    text = (BINDINGS / spec.support).read_text()
    missing = [py for py in inline if not re.search(rf"^def {py}\(", text, re.M)]
    if missing:
        raise ValueError(f"src/mpbind/bindings/{spec.support} does not define {missing}")


def _check_roles(ir: dict[str, Any]) -> None:
    """The IR loads as typed objects, and a role class renders every bound parameter."""
    lib = Library.from_json(ir)
    for f in lib.bound:
        for p in f.params:
            bound = roles.bind(lib, f, p)
            if p.non_null and (p.nullable or not isinstance(bound, (roles.Address, roles.Handle))):
                raise ValueError(f"{f.name}.{p.name}: non_null is for a pointer or handle that is not nullable")
            if p.minimum is not None and not (isinstance(bound, roles.Scalar) and bound.is_int):
                raise ValueError(f"{f.name}.{p.name}: minimum is for an int passed by value")


def _uses_in_progress(spec: Spec, f: dict[str, Any]) -> bool:
    rule = spec.status.get("in_progress_functions", [])
    if f["name"] in rule:
        return True
    handle = spec.status.get("in_progress_handle")
    if handle:
        for p in f["params"]:
            t = p["type"]
            if t["kind"] == "pointer":
                t = t["pointee"]
            if t.get("name") == handle:
                return True
    return False


def _void_unknown_pointees(parsed: dict[str, Any], known: set[str]) -> None:
    """A pointer to a struct the headers only forward-declare (or declare in C++
    only) is an address to mpbind: make it void*."""

    def fix(t: dict[str, Any]) -> None:
        if t["kind"] == "pointer":
            p = t["pointee"]
            if p["kind"] == "struct" and p["name"] not in known:
                t["pointee"] = {"kind": "builtin", "name": "void", **({"const": True} if p.get("const") else {})}
            else:
                fix(p)
        elif t["kind"] == "array":
            fix(t["element"])
        elif t["kind"] == "alias":
            fix(t["target"])

    for f in parsed["functions"]:
        fix(f["returns"])
        for p in f["params"]:
            fix(p["type"])
    for s in parsed["structs"]:
        for fl in s.get("fields", []):
            fix(fl["type"])
    for a in parsed["aliases"].values():
        fix(a)


def _success(spec: Spec, f: dict[str, Any]) -> list[str] | None:
    """The status names that mean success, or None when the return is not a status."""
    ret = f["returns"]
    statuses = list(spec.status["success"])
    if _uses_in_progress(spec, f):
        statuses.append(spec.status["in_progress"])
    if ret.get("name") == spec.status["type"]:
        return statuses
    # Libraries whose functions return a plain int status (spec: int_values lists the
    # functions whose int is a value instead).
    patterns = spec.status.get("int_values")
    if patterns is not None and ret["kind"] == "builtin" and ret["name"] == "int":
        if not any(re.match(p, f["name"]) for p in patterns):
            return statuses
    return None


def _families(spec: Spec, functions: list[dict[str, Any]], pynames: dict[str, str]) -> list[dict[str, Any]]:
    """Group <prefix>_<type>_<op> functions into one operation per op."""
    if not spec.family_types:
        return []
    types = "|".join(sorted(spec.family_types, key=len, reverse=True))
    prefixes = "|".join(re.escape(p) for p in sorted(spec.python_prefixes, key=len, reverse=True))
    rx = re.compile(rf"^(?:{prefixes})_?({types})_(\w+)$")
    fams: dict[str, dict[str, Any]] = {}
    for f in functions:
        if "python" not in f:
            continue
        m = rx.match(f["name"])
        if not m:
            continue
        tname, op = m.group(1), m.group(2)
        fam = fams.setdefault(op, {"python": op, "members": {}})
        if tname in fam["members"]:
            raise ValueError(f"family {op} has two {tname} members")
        fam["members"][tname] = f["name"]
    by_name = {f["name"]: f for f in functions}
    out = []
    for op, fam in sorted(fams.items()):
        if op in pynames:
            raise ValueError(f"family {op} collides with function {pynames[op]}")
        shapes = {tuple(p["role"] for p in by_name[c]["params"]) for c in fam["members"].values()}
        if len(shapes) != 1:
            raise ValueError(f"family {op}: members differ in their parameters")
        out.append(fam)
    return out
