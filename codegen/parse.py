"""Parse a library's pinned headers with libclang into the frozen API model (IR).

libclang is the parser because the headers mpbind binds are not all C: NCCL's
``nccl_device/*.h`` are C++, NVSHMEM marks device-only entry points with CUDA
attributes, and cuBLASMp pulls in cuBLAS. clang also evaluates what a C parser
would leave to us: enumerator values written as expressions, ``sizeof``-based
constants, struct sizes, alignments and field offsets, and the values inside the
``*_INITIALIZER`` macros. Nothing here runs at build time; the IR it writes is
checked in and is all the emitters read.
"""

from __future__ import annotations

import ctypes
import hashlib
import re
import struct
import subprocess
from pathlib import Path
from typing import Any

import clang.cindex as ci
from model import Spec

K = ci.CursorKind
T = ci.TypeKind

_BUILTINS: dict[Any, str] = {
    T.VOID: "void",
    T.BOOL: "bool",
    T.CHAR_S: "char",
    T.CHAR_U: "char",
    T.SCHAR: "signed char",
    T.UCHAR: "unsigned char",
    T.SHORT: "short",
    T.USHORT: "unsigned short",
    T.INT: "int",
    T.UINT: "unsigned int",
    T.LONG: "long",
    T.ULONG: "unsigned long",
    T.LONGLONG: "long long",
    T.ULONGLONG: "unsigned long long",
    T.FLOAT: "float",
    T.DOUBLE: "double",
}

# Standard typedefs kept by name: they are declared by libc's pxd files.
_STD_TYPEDEFS = {
    "size_t", "ssize_t", "ptrdiff_t", "intptr_t", "uintptr_t",
    "int8_t", "int16_t", "int32_t", "int64_t",
    "uint8_t", "uint16_t", "uint32_t", "uint64_t",
}


def _compiler_include_dirs() -> list[str]:
    """The C compiler's own header directories (stddef.h, limits.h, ...).

    The libclang wheel ships no resource headers, so borrow the system compiler's.
    """
    dirs = []
    for name in ("include", "include-fixed"):
        out = subprocess.run(["gcc", f"-print-file-name={name}"], capture_output=True, text=True)
        path = out.stdout.strip()
        if out.returncode == 0 and Path(path).is_dir():
            dirs.append(path)
    return dirs


class _Evaluator:
    """clang_Cursor_Evaluate, which the Python bindings do not wrap."""

    def __init__(self) -> None:
        lib = ci.conf.lib
        self._eval = lib.clang_Cursor_Evaluate
        self._eval.argtypes = [ci.Cursor]
        self._eval.restype = ctypes.c_void_p
        self._kind = lib.clang_EvalResult_getKind
        self._kind.argtypes = [ctypes.c_void_p]
        self._kind.restype = ctypes.c_int
        self._ll = lib.clang_EvalResult_getAsLongLong
        self._ll.argtypes = [ctypes.c_void_p]
        self._ll.restype = ctypes.c_longlong
        self._ull = lib.clang_EvalResult_getAsUnsigned
        self._ull.argtypes = [ctypes.c_void_p]
        self._ull.restype = ctypes.c_ulonglong
        self._uns = lib.clang_EvalResult_isUnsignedInt
        self._uns.argtypes = [ctypes.c_void_p]
        self._uns.restype = ctypes.c_uint
        self._dbl = lib.clang_EvalResult_getAsDouble
        self._dbl.argtypes = [ctypes.c_void_p]
        self._dbl.restype = ctypes.c_double
        self._str = lib.clang_EvalResult_getAsStr
        self._str.argtypes = [ctypes.c_void_p]
        self._str.restype = ctypes.c_char_p
        self._free = lib.clang_EvalResult_dispose
        self._free.argtypes = [ctypes.c_void_p]

    def __call__(self, cursor: ci.Cursor) -> int | float | str | None:
        res = self._eval(cursor)
        if not res:
            return None
        try:
            kind = self._kind(res)
            if kind == 1:  # CXEval_Int
                return int(self._ull(res)) if self._uns(res) else int(self._ll(res))
            if kind == 2:  # CXEval_Float
                return float(self._dbl(res))
            if kind in (3, 4, 5):  # ObjCStrLiteral, StrLiteral, CFStr
                raw = self._str(res)
                return raw.decode() if raw is not None else None
            return None
        finally:
            self._free(res)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class HeaderParser:
    def __init__(self, spec: Spec, include_dir: Path, cuda_include: str | None,
                 extra_includes: list[Path] | None = None) -> None:
        self.spec = spec
        self.include_dir = include_dir.resolve()
        self.args = ["-x", spec.language]
        if spec.language == "c++":
            self.args.append("-std=c++17")
        self.args += ["-I", str(self.include_dir)]
        for inc in extra_includes or []:
            self.args += ["-I", str(inc)]
        if cuda_include:
            self.args += ["-I", cuda_include]
        for d in _compiler_include_dirs():
            self.args += ["-isystem", d]
        self.args += [f"-D{d}" for d in spec.defines]
        self.evaluate = _Evaluator()

    # -- helpers ---------------------------------------------------------------
    def _own(self, cursor: ci.Cursor) -> str | None:
        """The header (relative to the include dir) that declares cursor, if ours."""
        loc = cursor.location.file
        return None if loc is None else self._own_path(loc.name)

    def _own_path(self, path: str) -> str | None:
        try:
            return str(Path(path).resolve().relative_to(self.include_dir))
        except ValueError:
            return None

    def _tu(self, extra: str = "") -> ci.TranslationUnit:
        src = "".join(f"#include <{h}>\n" for h in self.spec.headers) + extra
        name = "mpbind_probe.cpp" if self.spec.language == "c++" else "mpbind_probe.c"
        opts = ci.TranslationUnit.PARSE_DETAILED_PROCESSING_RECORD
        tu = ci.Index.create().parse(name, args=self.args, unsaved_files=[(name, src)], options=opts)
        errors = [d for d in tu.diagnostics if d.severity >= ci.Diagnostic.Error]
        if errors:
            raise RuntimeError("header parse failed:\n" + "\n".join(str(d) for d in errors[:20]))
        return tu

    def type_of(self, t: ci.Type) -> dict[str, Any]:
        """Normalise a clang type into the IR's type form."""
        const = t.is_const_qualified()
        out: dict[str, Any]
        if t.kind == T.ELABORATED:
            t2 = t.get_named_type()
            out = self.type_of(t2)
            if const:
                out["const"] = True
            return out
        vt = self._value_type(t)
        if vt is not None:
            return vt
        if t.kind == T.TYPEDEF:
            name = t.get_declaration().spelling
            canon = t.get_canonical()
            if name in _STD_TYPEDEFS:
                out = {"kind": "builtin", "name": name}
            elif name in self.spec.handles or name in self.spec.foreign_handles:
                out = {"kind": "handle", "name": name}
                self._note_handle_tag(name, canon)
            elif canon.kind == T.ENUM:
                out = {"kind": "enum", "name": self._tag_name(canon.get_declaration())}
            elif canon.kind == T.RECORD:
                # Named after the struct's own typedef (a typedef of a typedef,
                # like nvshmemx_init_attr_t -> nvshmemx_init_attr_v2, is the same struct).
                out = {"kind": "struct", "name": self._tag_name(canon.get_declaration())}
            elif canon.kind == T.POINTER and canon.get_pointee().kind == T.RECORD \
                    and canon.get_pointee().get_declaration().is_definition() is False:
                out = {"kind": "handle", "name": name}
                self._note_handle_tag(name, canon)
            else:
                under = t.get_declaration().underlying_typedef_type
                out = {"kind": "alias", "name": name, "target": self.type_of(under)}
        elif t.kind in (T.RECORD,):
            decl = t.get_declaration()
            out = {"kind": "struct", "name": self._tag_name(decl)}
        elif t.kind == T.ENUM:
            out = {"kind": "enum", "name": self._tag_name(t.get_declaration())}
        elif t.kind == T.POINTER and t.get_pointee().get_canonical().kind in (T.FUNCTIONPROTO, T.FUNCTIONNOPROTO):
            # A function pointer is an address to mpbind.
            out = {"kind": "pointer", "pointee": {"kind": "builtin", "name": "void"}}
        elif t.kind == T.POINTER:
            out = {"kind": "pointer", "pointee": self.type_of(t.get_pointee())}
        elif t.kind == T.CONSTANTARRAY:
            out = {"kind": "array", "element": self.type_of(t.element_type), "length": t.element_count}
        elif t.kind in _BUILTINS:
            out = {"kind": "builtin", "name": _BUILTINS[t.kind]}
        else:
            raise RuntimeError(f"unsupported type {t.spelling!r} ({t.kind})")
        if const:
            out["const"] = True
        return out

    def _note_handle_tag(self, name: str, canon: ci.Type) -> None:
        """The struct tag a handle points to (struct ncclComm), so every module declares it alike."""
        if canon.kind == T.POINTER and canon.get_pointee().kind == T.RECORD:
            self.handle_tags[name] = canon.get_pointee().get_declaration().spelling

    def _value_type(self, t: ci.Type) -> dict[str, Any] | None:
        """A type the spec passes as the builtin of the same size (CUDA's __half)."""
        for cand in (t, t.get_canonical()):
            decl = cand.get_declaration()
            name = decl.spelling if decl.kind != K.NO_DECL_FOUND else cand.spelling
            if name in self.spec.value_types:
                out: dict[str, Any] = {"kind": "builtin", "name": self.spec.value_types[name], "as": name}
                if t.is_const_qualified():
                    out["const"] = True
                return out
        return None

    def _tag_name(self, decl: ci.Cursor) -> str:
        """The typedef name of a struct or enum (ncclConfig_t), else its tag."""
        return self.typedef_of_record.get(decl.hash, decl.spelling)

    # -- the walk --------------------------------------------------------------
    def parse(self) -> dict[str, Any]:
        tu = self._tu()
        self.typedef_of_record: dict[int, str] = {}
        self.handle_tags: dict[str, str] = {}
        functions: list[dict[str, Any]] = []
        enums: dict[str, dict[str, Any]] = {}
        records: dict[str, ci.Cursor] = {}
        foreign_records: dict[str, ci.Cursor] = {}  # other headers' structs (CUDA's dim3), by name
        macros: list[tuple[str, str]] = []
        seen_fn: set[str] = set()
        # extern "C" blocks (LINKAGE_SPEC) hold most C declarations in C++ mode.
        flat = [k for c in tu.cursor.get_children()
                for k in (c.get_children() if c.kind == K.LINKAGE_SPEC else [c])]
        foreign_enums = set(self.spec.foreign_enums)
        typedefs = self._typedefs(flat, foreign_enums)
        for c in flat:
            header = self._own(c)
            if header is None:
                # Enums of other libraries' headers that this API takes (cudaDataType_t, ...).
                if c.kind == K.ENUM_DECL and c.is_definition() and self._tag_name(c) in foreign_enums:
                    name = self._tag_name(c)
                    enums.setdefault(name, self._enum(c, name, Path(c.location.file.name).name))
                elif c.kind == K.STRUCT_DECL and c.is_definition() and self._tag_name(c):
                    foreign_records.setdefault(self._tag_name(c), c)
                continue
            if c.kind == K.MACRO_DEFINITION:
                toks = [t.spelling for t in c.get_tokens()]
                if len(toks) >= 2 and not _is_function_like(c):
                    macros.append((c.spelling, header))
                continue
            if c.kind == K.FUNCTION_DECL:
                name = c.spelling
                if not name.startswith(self.spec.prefixes) or name in seen_fn:
                    continue
                if any(re.match(p, name) for p in self.spec.ignore_patterns):
                    continue
                seen_fn.add(name)
                functions.append(self._function(c, header))
            elif c.kind == K.ENUM_DECL and c.is_definition():
                name = self._tag_name(c)
                if name and not name.startswith("(") and name not in enums:
                    enums[name] = self._enum(c, name, header)
            elif c.kind == K.STRUCT_DECL and c.is_definition():
                name = self._tag_name(c)
                if name:
                    records[name] = c

        structs = {n: self._struct(records[n], n) for n in sorted(records)}
        self._add_foreign_structs(functions, structs, foreign_records)
        constants, initializers = self._macro_values(macros)
        for sname, init in self.spec.initializers.items():
            canon = typedefs[sname].underlying_typedef_type.get_canonical() if sname in typedefs else None
            key = self._tag_name(canon.get_declaration()) if canon is not None else sname
            if key in structs and init in initializers:
                structs[key]["initializer"] = {"macro": init, "image": initializers[init]}
        return {
            "functions": functions,
            "enums": [enums[k] for k in sorted(enums)],
            "structs": list(structs.values()),
            "aliases": self._aliases(typedefs),
            "handles": sorted(self.spec.handles),
            "handle_tags": dict(sorted(self.handle_tags.items())),
            "constants": constants,
            "included": self._included(tu),
        }

    def _add_foreign_structs(self, functions: list[dict[str, Any]], structs: dict[str, dict[str, Any]],
                             foreign: dict[str, ci.Cursor]) -> None:
        """Add the structs of other headers that our functions or structs hold by value (CUDA's
        dim3 and cudaLaunchConfig_t), with those they hold in turn; structs stay sorted by name."""
        types = [t for f in functions for t in [f["returns"], *(p["type"] for p in f["params"])]]
        while True:
            held = {n for t in types + [fl["type"] for s in structs.values() for fl in s.get("fields", [])]
                    for n in _by_value_structs(t)}
            new = sorted(n for n in held - structs.keys() if n in foreign)
            if not new:
                break
            for name in new:
                structs[name] = self._struct(foreign[name], name)
        ordered = {n: structs[n] for n in sorted(structs)}
        structs.clear()
        structs.update(ordered)

    def _included(self, tu: ci.TranslationUnit) -> list[str]:
        """Our headers the parse reached (the spec's and what they include)."""
        return sorted({h for inc in tu.get_includes() if (h := self._own_path(inc.include.name)) is not None}
                      | set(self.spec.headers))

    def _typedefs(self, flat: list[ci.Cursor], foreign_enums: set[str]) -> dict[str, ci.Cursor]:
        """The typedefs of our headers (and of the foreign enums), noting which name each record has."""
        typedefs = {}
        for c in flat:
            if c.kind == K.TYPEDEF_DECL and not self._own(c) and c.spelling not in foreign_enums:
                # Another header's struct is named after its typedef too (cudaLaunchConfig_t).
                under = c.underlying_typedef_type
                under = under.get_named_type() if under.kind == T.ELABORATED else under
                if under.kind == T.RECORD:
                    self.typedef_of_record.setdefault(under.get_declaration().hash, c.spelling)
                continue
            if c.kind == K.TYPEDEF_DECL and (self._own(c) or c.spelling in foreign_enums):
                under = c.underlying_typedef_type
                if under.kind == T.ELABORATED:
                    under = under.get_named_type()
                if under.kind in (T.RECORD, T.ENUM):
                    d = under.get_declaration()
                    self.typedef_of_record.setdefault(d.hash, c.spelling)
                typedefs[c.spelling] = c
        return typedefs

    def _aliases(self, typedefs: dict[str, ci.Cursor]) -> dict[str, dict[str, Any]]:
        """Typedefs of builtins and pointers (those of enums, structs and handles are resolved)."""
        aliases = {}
        for name, c in sorted(typedefs.items()):
            t = self.type_of(c.underlying_typedef_type)
            if t["kind"] in ("builtin", "alias", "pointer"):
                aliases[name] = t
        return aliases

    def _function(self, c: ci.Cursor, header: str) -> dict[str, Any]:
        params = []
        for i, a in enumerate(c.get_arguments()):
            params.append({"name": a.spelling or f"arg{i}", "type": self.type_of(a.type)})
        # A header-inline function (a body in the header, or `inline`) is not a
        # library symbol: there is nothing to dlsym.
        inline = c.is_definition() or any(t.spelling in ("inline", "__forceinline__") for t in c.get_tokens())
        # The spec defines __device__/__host__ as annotations (see its defines).
        notes = {ch.spelling for ch in c.get_children() if ch.kind == K.ANNOTATE_ATTR}
        return {
            "name": c.spelling,
            "header": header,
            "returns": self.type_of(c.result_type),
            "params": params,
            "inline": bool(inline),
            "device_only": "mpbind:device" in notes and "mpbind:host" not in notes,
            "deprecated": any(ch.kind == K.UNEXPOSED_ATTR and "deprecated" in
                              " ".join(t.spelling for t in ch.get_tokens()) for ch in c.get_children()),
        }

    def _enum(self, c: ci.Cursor, name: str, header: str) -> dict[str, Any]:
        values = [[e.spelling, e.enum_value] for e in c.get_children() if e.kind == K.ENUM_CONSTANT_DECL]
        out = {"name": name, "header": header, "values": values,
               "underlying": self.type_of(c.enum_type)["name"]}
        # Attribute enums document each value's C type ("... Type: int64_t."): keep it,
        # for typed get/set of the attribute.
        types = {}
        for e in c.get_children():
            m = re.search(r"Type:\s*((?:const\s+)?\w+\s*\*?)", e.raw_comment or "") \
                if e.kind == K.ENUM_CONSTANT_DECL else None
            if m:
                types[e.spelling] = " ".join(m.group(1).replace("*", " *").split())
        if types:
            out["value_types"] = types
        return out

    def _struct(self, c: ci.Cursor, name: str) -> dict[str, Any]:
        ty = c.type
        fields = []
        opaque_reason = None
        for f in c.type.get_fields():
            try:
                ft = self.type_of(f.type)
            except RuntimeError as exc:
                opaque_reason = str(exc)
                break
            if f.is_anonymous() or not f.spelling:
                opaque_reason = "anonymous member"
                break
            if ft["kind"] == "struct" and not ft["name"]:
                opaque_reason = "unnamed nested record"
                break
            if f.is_bitfield():
                opaque_reason = "bit-field"
                break
            fields.append({"name": f.spelling, "type": ft, "offset": ty.get_offset(f.spelling) // 8})
        header = self._own(c) or Path(c.location.file.name).name  # another library's: its file name
        out: dict[str, Any] = {"name": name, "header": header, "size": ty.get_size(),
                               "align": ty.get_align()}
        if opaque_reason is None:
            out["fields"] = fields
        else:
            out["opaque"] = opaque_reason
        return out

    def _fill(self, init: ci.Cursor, t: ci.Type, base: int, image: bytearray) -> None:
        """Write the bytes of initializer list `init` for type t at offset base."""
        t = t.get_canonical()
        kids = list(init.get_children())
        if t.kind == T.CONSTANTARRAY:
            et = t.element_type
            for i, k in enumerate(kids):
                self._fill_one(k, et, base + i * et.get_size(), image)
            return
        fields = list(t.get_fields())
        for f, k in zip(fields, kids, strict=False):
            self._fill_one(k, f.type, base + t.get_offset(f.spelling) // 8, image)

    def _fill_one(self, k: ci.Cursor, t: ci.Type, off: int, image: bytearray) -> None:
        k = _unwrap(k)
        ct = t.get_canonical()
        if k.kind == K.INIT_LIST_EXPR:
            self._fill(k, ct, off, image)
            return
        size = ct.get_size()
        v = self.evaluate(k)
        if v is None:
            toks = "".join(x.spelling for x in k.get_tokens())
            if ct.kind == T.POINTER or toks in ("NULL", "__null", "nullptr", "0"):
                v = 0
            else:
                raise RuntimeError(f"cannot evaluate initializer element {toks!r}")
        if ct.kind in (T.FLOAT, T.DOUBLE):
            raw = struct.pack("<f" if size == 4 else "<d", float(v))
        else:
            raw = (int(v) & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
        image[off:off + size] = raw

    def _macro_values(self, macros: list[tuple[str, str]]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """Evaluate object-like macros and struct initializers with the compiler."""
        wanted = [(m, h) for m, h in macros if any(re.match(p, m) for p in self.spec.constant_patterns)]
        probe = []
        for m, _ in wanted:
            auto = "auto" if self.spec.language == "c++" else "__auto_type"
            probe.append(f"static const {auto} mpbind_const_{m} = ({m});\n")
        for sname, init in self.spec.initializers.items():
            probe.append(f"static {sname} mpbind_init_{init} = {init};\n")
        tu = self._tu("".join(probe))
        values: dict[str, Any] = {}
        inits: dict[str, Any] = {}
        for c in tu.cursor.get_children():
            if c.kind != K.VAR_DECL:
                continue
            if c.spelling.startswith("mpbind_const_"):
                values[c.spelling[len("mpbind_const_"):]] = self.evaluate(c)
            elif c.spelling.startswith("mpbind_init_"):
                init_name = c.spelling[len("mpbind_init_"):]
                lists = [ch for ch in c.get_children() if ch.kind == K.INIT_LIST_EXPR]
                if lists:
                    image = bytearray(c.type.get_size())
                    self._fill(lists[0], c.type, 0, image)
                    inits[init_name] = image.hex()
        consts = []
        for m, h in wanted:
            v = values.get(m)
            if v is None:
                continue
            consts.append({"name": m, "header": h, "value": v})
        return consts, inits


def _by_value_structs(t: dict[str, Any]) -> set[str]:
    """The structs a value of IR type t holds by value (through arrays and typedefs, not pointers)."""
    if t["kind"] == "struct":
        return {t["name"]}
    if t["kind"] == "array":
        return _by_value_structs(t["element"])
    if t["kind"] == "alias":
        return _by_value_structs(t["target"])
    return set()


def declaring_headers(include: Path, names: set[str]) -> dict[str, str | None]:
    """For functions the parse did not declare, the header under `include` whose text declares
    each (`name(` outside a comment line), or None: found by reading, not parsing, because such a
    header may be device code or for another platform."""
    found: dict[str, str | None] = dict.fromkeys(sorted(names))
    if not names:
        return found
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, sorted(names))) + r")\s*\(")
    for path in sorted(p for p in include.rglob("*") if p.suffix in (".h", ".hpp", ".cuh")):
        for line in path.read_text(errors="replace").splitlines():
            if line.lstrip().startswith(("//", "*", "/*", "#define")):
                continue
            for m in pattern.finditer(line):
                if found[m.group(1)] is None:
                    found[m.group(1)] = str(path.relative_to(include))
    return found


def _unwrap(c: ci.Cursor) -> ci.Cursor:
    """Skip implicit casts and parentheses around an initializer element."""
    while c.kind in (K.UNEXPOSED_EXPR, K.PAREN_EXPR, K.CSTYLE_CAST_EXPR) and \
            len(kids := list(c.get_children())) == 1 and kids[0].kind != K.INTEGER_LITERAL:
        if kids[0].kind == K.INIT_LIST_EXPR:
            return kids[0]
        c = kids[0]
    return c


def _is_function_like(c: ci.Cursor) -> bool:
    toks = list(c.get_tokens())
    if len(toks) < 2:
        return False
    # function-like: '(' immediately follows the name with no whitespace.
    a, b = toks[0], toks[1]
    return b.spelling == "(" and a.extent.end.offset == b.extent.start.offset
