"""Render <lib>.pyx: the Python API (enums, struct classes, functions) from the IR."""

from __future__ import annotations

import ast
from typing import Any

from emit_common import Index, cy_type, internal_fields
from plan import Plan, is_char_ptr, is_void, plan, resolve, value_kind

I4 = "    "
I8 = I4 * 2


def _const_name(ix: Index, name: str) -> str:
    for p in sorted(ix.ir["prefixes"], key=len, reverse=True):
        if name.startswith(p.upper() + "_"):
            return name[len(p) + 1:]
    return name


def _enum_ctype(e: dict[str, Any]) -> str:
    vals = [v for _, _, v in e["members"]]
    return "long long" if any(v < -(2**31) or v >= 2**31 for v in vals) else "int"


# -- struct classes -----------------------------------------------------------------

def _field_get(ix: Index, f: dict[str, Any]) -> list[str]:
    t = f["type"]
    n = f["name"]
    if t["kind"] == "array":
        el = t["element"]
        vk = value_kind(ix, el)
        if vk == "struct":
            cls = ix.structs[resolve(ix, el)["name"]]["python"]
            return [f"return tuple({cls}._from_data(self._data.{n}[i]) for i in range({t['length']}))"]
        if vk == "bool":
            return [f"return tuple(bool(self._data.{n}[i]) for i in range({t['length']}))"]
        if vk in ("handle", "address"):
            return [f"return tuple(<intptr_t>self._data.{n}[i] for i in range({t['length']}))"]
        return [f"return tuple(self._data.{n}[i] for i in range({t['length']}))"]
    vk = value_kind(ix, t)
    if vk in ("int", "float"):
        return [f"return self._data.{n}"]
    if vk == "bool":
        return [f"return bool(self._data.{n})"]
    if vk == "enum":
        cls = ix.enums[resolve(ix, t)["name"]]["python"]
        return [f"return _enum_or_int({cls}, self._data.{n})"]
    if vk in ("handle", "address"):
        return [f"return <intptr_t>self._data.{n}"]
    if vk == "str":
        return [f"return None if self._data.{n} == NULL else (<bytes>self._data.{n}).decode()"]
    if vk == "struct":
        cls = ix.structs[resolve(ix, t)["name"]]["python"]
        return [f"return {cls}._from_data(self._data.{n})"]
    raise ValueError(vk)


def _field_set(ix: Index, f: dict[str, Any]) -> list[str]:
    t = f["type"]
    n = f["name"]
    if t["kind"] == "array":
        el = t["element"]
        vk = value_kind(ix, el)
        ln = t["length"]
        out = [f"if len(value) != {ln}:",
               f'{I4}raise _UsageError("{n} takes exactly {ln} values, got %d" % len(value))',
               f"for i in range({ln}):"]
        if vk == "struct":
            cls = ix.structs[resolve(ix, el)["name"]]["python"]
            out.append(f"{I4}self._data.{n}[i] = (<{cls}?>value[i])._data")
        elif vk in ("handle", "address"):
            out.append(f"{I4}self._data.{n}[i] = <{cy_type(el, drop_const=True)}><intptr_t>value[i]")
        else:
            out.append(f"{I4}self._data.{n}[i] = value[i]")
        return out
    vk = value_kind(ix, t)
    ct = cy_type(t, drop_const=True)
    if vk in ("int", "float", "bool"):
        return [f"self._data.{n} = value"]
    if vk == "enum":
        return [f"self._data.{n} = <{ct}><{_enum_ctype(ix.enums[resolve(ix, t)['name']])}>value"]
    if vk in ("handle", "address"):
        return [f"self._data.{n} = <{ct}><intptr_t>value"]
    if vk == "str":
        return ["if value is None:",
                f"{I4}self._data.{n} = NULL",
                f'{I4}self._refs.pop("{n}", None)',
                "else:",
                f"{I4}b = _to_bytes(value, \"{n}\")",
                f'{I4}self._refs["{n}"] = b',
                f"{I4}self._data.{n} = <const char*>b"]
    if vk == "struct":
        cls = ix.structs[resolve(ix, t)["name"]]["python"]
        return [f"self._data.{n} = (<{cls}?>value)._data"]
    raise ValueError(vk)


def _struct_class(ix: Index, s: dict[str, Any]) -> list[str]:
    cls = s["python"]
    name = s["name"]
    init = s.get("initializer")
    fields = s.get("fields", [])
    internal = internal_fields(s)
    lines = [f"cdef class {cls}:"]
    if s.get("kind") == "bytes":
        doc = f"{name}: {s['size']} opaque bytes; bytes-like, comparable, hashable and picklable."
    elif "opaque" in s:
        doc = f"{name}: opaque ({s['opaque']}). `ptr` is its address, `bytes(obj)` its content."
    else:
        dflt = f" Defaults come from {init['macro']}." if init else ""
        doc = f"{name} with attribute access to its fields.{dflt}"
    lines += [f'{I4}"""{doc}"""', "", f"{I4}cdef {name} _data", f"{I4}cdef dict _refs", ""]
    # Construction
    lines += [f"{I4}def __cinit__(self):", f"{I8}self._refs = {{}}"]
    if init:
        # The bytes of the *_INITIALIZER value, as the compiler laid it out.
        lines += [f"{I8}memcpy(&self._data, <const char*>{bytes.fromhex(init['image'])!r}, sizeof({name}))", ""]
    else:
        lines += [f"{I8}memset(&self._data, 0, sizeof({name}))", ""]
    if s.get("kind") == "bytes":
        lines += [
            f"{I4}def __init__(self, data=None):",
            f"{I8}if data is not None:",
            f"{I8}{I4}b = bytes(memoryview(data))  # bytes-like only: bytes(n) would make n zeros",
            f"{I8}{I4}if len(b) != sizeof({name}):",
            f'{I8}{I4}{I4}raise _UsageError("{cls} takes exactly %d bytes, got %d" % (sizeof({name}), len(b)))',
            f"{I8}{I4}memcpy(&self._data, <const char*>b, sizeof({name}))",
            "",
            f"{I4}def __bytes__(self):",
            f"{I8}return (<const char*>&self._data)[:sizeof({name})]",
            "",
            f"{I4}def __len__(self):",
            f"{I8}return sizeof({name})",
            "",
            f"{I4}def __getbuffer__(self, Py_buffer* buffer, int flags):",
            f"{I8}PyBuffer_FillInfo(buffer, self, &self._data, sizeof({name}), 1, flags)",
            "",
            f"{I4}def __releasebuffer__(self, Py_buffer* buffer):",
            f"{I8}pass",
            "",
            f"{I4}def __eq__(self, other):",
            f"{I8}if not isinstance(other, {cls}):",
            f"{I8}{I4}return NotImplemented",
            f"{I8}return bytes(self) == bytes(other)",
            "",
            f"{I4}def __hash__(self):",
            f"{I8}return hash(bytes(self))",
            "",
            f"{I4}def __reduce__(self):",
            f"{I8}return ({cls}, (bytes(self),))",
            "",
            f"{I4}def __repr__(self):",
            f'{I8}return "{cls}(%s...)" % bytes(self)[:8].hex()',
            "",
        ]
    elif "opaque" in s:
        lines += [
            f"{I4}def __bytes__(self):",
            f"{I8}return (<const char*>&self._data)[:sizeof({name})]",
            "",
            f"{I4}def __repr__(self):",
            f'{I8}return "<{cls} at 0x%x>" % <intptr_t>&self._data',
            "",
        ]
    else:
        names = [f["name"] for f in fields if f["name"] not in internal]
        lines += [
            f"{I4}def __init__(self, **fields):",
            f"{I8}for key, value in fields.items():",
            f"{I8}{I4}if key not in {cls}._FIELDS:",
            f'{I8}{I4}{I4}raise TypeError("{cls} has no settable field %r (fields: %s)"'
            f' % (key, ", ".join({cls}._FIELDS)))',
            f"{I8}{I4}setattr(self, key, value)",
            "",
            f"{I4}_FIELDS = {tuple(names)!r}",
            "",
            f"{I4}def __repr__(self):",
            f'{I8}return "{cls}(%s)" % ", ".join("%s=%r" % (k, getattr(self, k)) for k in {cls}._FIELDS)',
            "",
        ]
        for f in fields:
            n = f["name"]
            lines.append(f"{I4}@property")
            lines.append(f"{I4}def {n}(self):")
            lines += [f"{I8}{x}" for x in _field_get(ix, f)]
            lines.append("")
            if n in internal:
                continue
            lines.append(f"{I4}@{n}.setter")
            lines.append(f"{I4}def {n}(self, value):")
            lines += [f"{I8}{x}" for x in _field_set(ix, f)]
            lines.append("")
    lines += [
        f"{I4}@property",
        f"{I4}def ptr(self):",
        f'{I8}"""Address of the C struct (valid while this object lives)."""',
        f"{I8}return <intptr_t>&self._data",
        "",
        f"{I4}@property",
        f"{I4}def nbytes(self):",
        f"{I8}return sizeof({name})",
        "",
        f"{I4}@staticmethod",
        f"{I4}def from_ptr(intptr_t address):",
        f'{I8}"""A copy of the {name} at `address` (for example one a library call returned)."""',
        f"{I8}if address == 0:",
        f'{I8}{I4}raise _UsageError("{cls}.from_ptr: NULL address")',
        f"{I8}return {cls}._from_data((<{name}*>address)[0])",
        "",
        f"{I4}@staticmethod",
        f"{I4}cdef {cls} _from_data({name} data):",
        f"{I8}cdef {cls} obj = {cls}.__new__({cls})",
        f"{I8}obj._data = data",
        f"{I8}return obj",
        "",
        "",
    ]
    return lines


# -- functions ------------------------------------------------------------------------

def _local_decl(ix: Index, t: dict[str, Any], name: str) -> str:
    return f"cdef {cy_type(t, name, drop_const=False)}"


def _convert_out(ix: Index, t: dict[str, Any], expr: str) -> str:
    """Python value of the C value expr of type t."""
    vk = value_kind(ix, t)
    if vk in ("int", "float"):
        return expr
    if vk == "bool":
        return f"bool({expr})"
    if vk == "enum":
        return f"_enum_or_int({ix.enums[resolve(ix, t)['name']]['python']}, {expr})"
    if vk in ("handle", "address"):
        return f"<intptr_t>{expr}"
    if vk == "str":
        return f"_str_or_none({expr})"
    if vk == "struct":
        return f"{ix.structs[resolve(ix, t)['name']]['python']}._from_data({expr})"
    raise ValueError(vk)


def _function(ix: Index, p: Plan) -> list[str]:
    f = p.f
    ir = ix.ir
    sig = []
    for pp in p.params:
        cp = pp.c
        t = cp["type"]
        decl = pp.name
        if cp["role"] == "in" and not cp.get("struct") and not cp.get("nullable") and not cp.get("convert"):
            is_address = t["kind"] == "pointer" and (cp.get("address") or not is_char_ptr(t))
            vk = "address" if is_address else value_kind(ix, t)
            if vk in ("int", "float", "bool"):
                decl = f"{cy_type(resolve(ix, t), pp.name, drop_const=True)}"
                if resolve(ix, t)["name"] == "bool":
                    decl = f"bint {pp.name}"
            elif vk == "enum":
                decl = f"{_enum_ctype(ix.enums[resolve(ix, t)['name']])} {pp.name}"
            elif vk in ("handle", "address"):
                decl = f"intptr_t {pp.name}"
        if pp.default is not None:
            decl += f"={pp.default}"
        sig.append(decl)

    doc = [f"{f['name']}({', '.join(cy_type(q['type'], q['name']) for q in f['params'])})"]
    if p.returns:
        doc.append("")
        doc.append(f"Returns {p.return_type}.")
    doc.append("")
    doc.append("Releases the GIL." if f["gil"] == "release" else "Keeps the GIL (an O(1) query).")
    if not f["since"].startswith("<="):
        doc.append(f"Needs {ir['pretty']} {f['since']} or later.")
    body: list[str] = []
    body.append(f'"""{chr(10).join(d for d in doc).rstrip()}"""'.replace("\n", "\n" + I4))
    pre: list[str] = []
    post: list[str] = []
    cleanup: list[str] = []
    args: list[str] = []
    for cp in f["params"]:
        role = cp["role"]
        t = cp["type"]
        n = cp["name"]
        py = cp["python"]
        if role in ("in", "inout"):
            if cp.get("convert"):
                # _convert_<name>: the generated mpi_comm one, or one from the spec's support code
                pre.append(f"cdef intptr_t _h_{n} = _convert_{cp['convert']}({py})")
                args.append(f"<{cy_type(t)}>_h_{n}")
            elif t["kind"] == "pointer" and cp.get("struct"):
                cls = ix.structs[cp["struct"]]["python"]
                pre.append(f"cdef {cy_type(t['pointee'], drop_const=True)}* _p_{n} = NULL")
                conv = f"_o_{n} = _as_{cls}({py}, \"{py}\"); _p_{n} = &(<{cls}>_o_{n})._data"
                if cp.get("nullable"):
                    pre.append(f"if {py} is not None:")
                    pre.append(f"{I4}{conv}")
                else:
                    pre.append(conv)
                args.append(f"_p_{n}")
            elif is_char_ptr(t) and not cp.get("address"):
                pre.append(f"cdef const char* _s_{n} = NULL")
                pre.append(f"cdef bytes _b_{n} = None")
                if cp.get("nullable"):
                    pre.append(f"if {py} is not None:")
                    pre.append(f"{I4}_b_{n} = _to_bytes({py}, \"{py}\"); _s_{n} = <const char*>_b_{n}")
                else:
                    pre.append(f"_b_{n} = _to_bytes({py}, \"{py}\"); _s_{n} = <const char*>_b_{n}")
                args.append(f"_s_{n}")
            elif t["kind"] == "pointer":
                if cp.get("nullable"):
                    pre.append(f"cdef intptr_t _h_{n} = 0 if {py} is None else {py}")
                    args.append(f"<{cy_type(t)}>_h_{n}")
                else:
                    args.append(f"<{cy_type(t)}>{py}")
            else:
                vk = value_kind(ix, t)
                if vk == "struct":
                    cls = ix.structs[resolve(ix, t)["name"]]["python"]
                    ct = cy_type(resolve(ix, t), drop_const=True)
                    pre.append(f"cdef {ct} _v_{n} = (<{cls}>_as_{cls}({py}, \"{py}\"))._data")
                    args.append(f"_v_{n}")
                elif vk == "enum":
                    args.append(f"<{cy_type(t, drop_const=True)}>{py}")
                elif vk == "address":
                    args.append(f"<{cy_type(t, drop_const=True)}>{py}")
                elif vk == "handle":
                    if cp.get("nullable"):
                        pre.append(f"cdef intptr_t _h_{n} = 0 if {py} is None else {py}")
                        args.append(f"<{cy_type(t, drop_const=True)}>_h_{n}")
                    else:
                        args.append(f"<{cy_type(t, drop_const=True)}>{py}")
                else:
                    args.append(py)
        elif role == "in_array":
            el = t["pointee"]
            elt = cy_type(el, drop_const=True)
            pre.append(f"cdef {elt}* _a_{n} = NULL")
            pre.append(f"cdef Py_ssize_t _n_{n} = 0")
            src = f"_seq_{n}"
            if cp.get("nullable"):
                pre.append(f"if {py} is not None:")
                ind = I4
            else:
                ind = ""
            pre.append(f"{ind}{src} = list({py})")
            pre.append(f"{ind}_n_{n} = len({src})")
            if cp.get("explicit_length"):
                ln = next(q["python"] for q in f["params"] if q["name"] == cp["length"])
                pre.append(f"{ind}if _n_{n} != {ln}:")
                pre.append(f'{ind}{I4}raise _UsageError("{py} has %d elements; {ln} is %d" % (_n_{n}, {ln}))')
            pre.append(f"{ind}_a_{n} = <{elt}*>PyMem_Malloc(max(_n_{n}, 1) * sizeof({elt}))")
            pre.append(f"{ind}if _a_{n} == NULL:")
            pre.append(f"{ind}{I4}raise MemoryError()")
            pre.append(f"{ind}for _i in range(_n_{n}):")
            vk = value_kind(ix, el)
            if vk == "struct":
                cls = ix.structs[resolve(ix, el)["name"]]["python"]
                pre.append(f"{ind}{I4}_a_{n}[_i] = (<{cls}>_as_{cls}({src}[_i], \"{py}\"))._data")
            elif vk in ("handle", "address"):
                pre.append(f"{ind}{I4}_a_{n}[_i] = <{elt}><intptr_t>{src}[_i]")
            elif vk == "enum":
                pre.append(f"{ind}{I4}_a_{n}[_i] = <{elt}><int>{src}[_i]")
            else:
                pre.append(f"{ind}{I4}_a_{n}[_i] = {src}[_i]")
            cleanup.append(f"PyMem_Free(_a_{n})")
            args.append(f"_a_{n}")
        elif role == "length":
            of = cp["length_of"]
            args.append(f"<{cy_type(t, drop_const=True)}>_n_{of}")
        elif role == "out":
            pt = t["pointee"]
            vk = value_kind(ix, pt)
            if vk == "struct":
                cls = ix.structs[resolve(ix, pt)["name"]]["python"]
                pre.append(f"cdef {cls} _r_{n} = {cls}()")
                args.append(f"&_r_{n}._data")
                post.append(f"_r_{n}")
            else:
                init = " = NULL" if vk in ("handle", "address", "str") else ""
                pre.append(f"cdef {cy_type(pt, '_r_' + n, drop_const=False)}{init}")
                args.append(f"&_r_{n}")
                post.append(_convert_out(ix, pt, f"_r_{n}"))
        elif role == "out_str_buffer":
            cap = next(c["value"] for c in ir["constants"] if c["name"] == cp["capacity_constant"])
            pre.append(f"cdef char _sb_{n}[{cap}]")
            pre.append(f"memset(_sb_{n}, 0, {cap})")
            args.append(f"_sb_{n}")
            post.append(f"_sb_{n}[:{cap - 1}].split(b'\\0', 1)[0].decode(errors=\"replace\")")
        elif role == "out_discard":
            pt = t["pointee"]
            pre.append(f"cdef {cy_type(pt, '_d_' + n, drop_const=False)}")
            args.append(f"&_d_{n}")
        elif role == "out_array":
            pt = t["pointee"]
            elt = cy_type(pt, drop_const=True)
            ln = next(q["python"] for q in f["params"] if q["name"] == cp["length"])
            pre.append(f"if {ln} < 0:")
            pre.append(f'{I4}raise _UsageError("{ln} must be >= 0, got %d" % {ln})')
            pre.append(f"cdef {elt}* _oa_{n} = <{elt}*>PyMem_Malloc(max({ln}, 1) * sizeof({elt}))")
            pre.append(f"if _oa_{n} == NULL:")
            pre.append(f"{I4}raise MemoryError()")
            pre.append(f"memset(_oa_{n}, 0, max({ln}, 1) * sizeof({elt}))")
            cleanup.append(f"PyMem_Free(_oa_{n})")
            args.append(f"_oa_{n}")
            post.append(f"[{_convert_out(ix, pt, f'_oa_{n}[_i]')} for _i in range({ln})]")
        elif role == "out_bytes":
            cap = next(q["python"] for q in f["params"] if q["name"] == cp["capacity"])
            lo = cp["length_out"]
            pre.append(f"if {cap} < 0:")
            pre.append(f'{I4}raise _UsageError("{cap} must be >= 0, got %d" % {cap})')
            pre.append(f"cdef char* _ob_{n} = <char*>PyMem_Malloc(max({cap}, 1))")
            pre.append(f"if _ob_{n} == NULL:")
            pre.append(f"{I4}raise MemoryError()")
            cleanup.append(f"PyMem_Free(_ob_{n})")
            args.append(f"<void*>_ob_{n}")
            post.append(f"_ob_{n}[:min(max(_d_{lo}, 0), {cap})]")
        elif role == "out_str_array":
            lo = cp["length_out"]
            pre.append(f"cdef const char** _osa_{n} = NULL")
            args.append(f"&_osa_{n}")
            post.append(f"[_str_or_none(_osa_{n}[_i]) for _i in range(_d_{lo})] if _osa_{n} != NULL else []")
        else:
            raise ValueError(role)

    call = f"{f['name']}({', '.join(args)})"
    status = f.get("success") is not None
    ret = f["returns"]
    call_lines: list[str] = []
    if status:
        call_lines.append(f"__status__ = {call}")
    elif is_void(ret):
        call_lines.append(call)
    else:
        call_lines.append(f"__ret__ = {call}")
    if f["gil"] == "release":
        call_lines = ["with nogil:"] + [I4 + x for x in call_lines]
    decls = []
    if status:
        decls.append(f"cdef {cy_type(ret, '__status__', drop_const=True)}")
    elif not is_void(ret):
        decls.append(f"cdef {cy_type(ret, '__ret__', drop_const=False)}")
    check: list[str] = []
    if status:
        codes = [v for cn, _, v in ix.enums[ix.status_type]["members"] if cn in f["success"]]
        cond = " and ".join(f"__status__ != {c}" for c in codes)
        check.append(f"if {cond}:")
        check.append(f'{I4}_raise_error(__status__, "{f["name"]}")')
    if f.get("null_error"):
        nonzero = " and ".join(f"{n} != 0" for n in f["null_error"])
        null_code = next(v for cn, _, v in ix.enums[ix.status_type]["members"] if cn == ir["status"]["null_status"])
        check.append(f"if __ret__ == NULL and {nonzero}:")
        check.append(f'{I4}_raise_error({null_code}, "{f["name"]}")')
    results = []
    if not status and not is_void(ret):
        results.append(_convert_out(ix, ret, "__ret__"))
    results += post
    if not results:
        tail = ["return None"]
    elif len(results) == 1:
        tail = [f"return {results[0]}"]
    else:
        tail = [f"return ({', '.join(results)})"]

    for cp in f["params"]:
        for kept in cp.get("keeps", []):
            # The call stores a pointer into kept's data in this struct: keep kept alive with it.
            kp = next(q for q in f["params"] if q["name"] == kept)
            check.append(f'(<{ix.structs[cp["struct"]]["python"]}>_o_{cp["name"]})._refs["{kept}"] = _o_{kp["name"]}')
    inner = call_lines + check + tail
    if cleanup:
        # Everything that can fail runs inside try, so finally frees what was
        # allocated; Cython wants the declarations outside it.
        hoisted, stmts = _hoist_declarations(pre)
        body += decls + hoisted + ["try:"] + [I4 + x for x in stmts + inner] + ["finally:"]
        body += [I4 + c for c in cleanup]
    else:
        body += decls + pre + inner
    out = [f"def {f['python']}({', '.join(sig)}):"] + [I4 + b for b in body]
    return [line.rstrip() for line in "\n".join(out).split("\n")] + ["", ""]


def untyped_params(signature: str) -> str:
    """The parameter list of a Python signature "(a: int, b: X = None) -> R" without annotations."""
    fn = ast.parse(f"def f{signature}: ...").body[0]
    assert isinstance(fn, ast.FunctionDef)
    args = fn.args.args
    defaults = [None] * (len(args) - len(fn.args.defaults)) + list(fn.args.defaults)
    return ", ".join(a.arg if d is None else f"{a.arg}={ast.unparse(d)}" for a, d in zip(args, defaults, strict=True))


# struct format of each C type an attribute can take (enums are C ints).
_ATTRIBUTE_FORMATS = {"int32_t": "i", "int": "i", "uint32_t": "I", "int64_t": "q", "uint64_t": "Q",
                      "size_t": "Q", "float": "f", "double": "d", "void *": "Q", "const void *": "Q"}


def attribute_table(ix: Index, enum_name: str) -> dict[str, tuple[str, str, str | None]]:
    """C enumerator -> (C type, struct format, Python enum class or None), from the header's docs."""
    e = ix.enums[enum_name]
    table = {}
    for cname, ctype in e["value_types"].items():
        if ctype in ix.enums:
            table[cname] = (ctype, "i", ix.enums[ctype]["python"])
        elif ctype in _ATTRIBUTE_FORMATS:
            table[cname] = (ctype, _ATTRIBUTE_FORMATS[ctype], None)
        else:
            raise ValueError(f"{enum_name}.{cname}: no format for attribute type {ctype}")
    missing = [cn for cn, _, _ in e["members"] if cn not in table]
    if missing:
        raise ValueError(f"{enum_name}: the header documents no type for {missing}")
    return table


def _typed_attribute(ix: Index, enum_name: str, ta: dict[str, str]) -> list[str]:
    """<python>_set(obj, attr, value) / <python>_get(obj, attr) with each attribute's C type."""
    e = ix.enums[enum_name]
    cls = e["python"]
    by_c = {f["name"]: f for f in ix.bound}
    setter, getter = by_c[ta["set"]]["python"], by_c[ta["get"]]["python"]
    name = ta["python"]
    table = attribute_table(ix, enum_name)
    py_of = {cn: py for cn, py, _ in e["members"]}
    table_name = f"{name.upper()}_ATTRIBUTE_TYPES"
    rows = ", ".join(f'{cls}.{py_of[cn]}: ({ct!r}, {fmt!r}, {pc or "None"})' for cn, (ct, fmt, pc) in table.items())
    return [
        f"# {enum_name} value -> (C type, struct format, enum class), from the header's documentation.",
        f"{table_name} = {{{rows}}}",
        "",
        "",
        f"cdef tuple _{name}_attribute(object attr):",
        f"{I4}try:",
        f"{I8}key = {cls}(attr)",
        f"{I4}except ValueError:",
        f'{I8}raise _UsageError("unknown {cls} value %r" % (attr,)) from None',
        f"{I4}return (key,) + {table_name}[key]",
        "",
        "",
        f"def {name}_set(obj, attr, value):",
        f'{I4}"""Set attribute `attr` ({cls}) to `value`, checked against the attribute\'s C type;',
        f'{I4}then {ta["set"]}."""',
        f"{I4}key, ctype, fmt, enum_cls = _{name}_attribute(attr)",
        f"{I4}if isinstance(value, float) and fmt not in ('f', 'd') or isinstance(value, (str, bytes)):",
        f'{I8}raise _UsageError("%s takes %s, not %s" % (key.name, ctype, type(value).__name__))',
        f"{I4}if enum_cls is not None:",
        f"{I8}try:",
        f"{I8}{I4}enum_cls(value)",
        f"{I8}except ValueError:",
        f'{I8}{I4}raise _UsageError("%s takes %s: %r is not one of its values" % (key.name, ctype, value)) from None',
        f"{I4}try:",
        f"{I8}buf = _struct.pack(fmt, value)",
        f"{I4}except _struct.error as exc:",
        f'{I8}raise _UsageError("%s takes %s: %s" % (key.name, ctype, exc)) from None',
        f"{I4}cdef const char* p = buf",
        f"{I4}{setter}(obj, key, <intptr_t>p, len(buf))",
        "",
        "",
        f"def {name}_get(obj, attr):",
        f'{I4}"""The value of attribute `attr` ({cls}) as its C type (enums as their IntEnum); {ta["get"]}."""',
        f"{I4}key, ctype, fmt, enum_cls = _{name}_attribute(attr)",
        f"{I4}cdef char out[16]",
        f"{I4}memset(out, 0, 16)",
        f"{I4}size = _struct.calcsize(fmt)",
        f"{I4}{getter}(obj, key, <intptr_t>out, size)",
        f"{I4}value = _struct.unpack(fmt, out[:size])[0]",
        f"{I4}return value if enum_cls is None else _enum_or_int(enum_cls, value)",
        "",
        "",
    ]


def _inline_function(f: dict[str, Any]) -> list[str]:
    """A header's static inline function, reproduced by the spec over exported entry points."""
    body = f["inline_body"]
    doc = f"{f['name']}: static inline in the header; {body['doc']}"
    out = [f"def {f['python']}({untyped_params(body['signature'])}):", f'{I4}"""{doc}"""']
    out += [I4 + line if line else "" for line in body["body"].strip("\n").split("\n")]
    return out + ["", ""]


def _families(ix: Index) -> list[str]:
    """One dispatcher per per-type family: <op>(dtype, ...) -> <type>_<op>(...)."""
    ir = ix.ir
    by_name = {f["name"]: f for f in ix.bound}
    lines = [
        "# Type name -> NumPy dtype name, for the family dispatchers.",
        f"FAMILY_TYPES = {ir['family_types']!r}",
        "",
        "",
        "cdef str _type_name(object dtype, dict members, str op):",
        f"{I4}if isinstance(dtype, str) and dtype in members:",
        f"{I8}return dtype",
        f"{I4}if isinstance(dtype, str) and dtype in FAMILY_TYPES:",
        f'{I8}raise _UsageError("%s has no %s variant; types: %s" % (op, dtype, ", ".join(members)))',
        f"{I4}try:",
        f"{I8}import numpy",
        f"{I8}np_name = numpy.dtype(dtype).name",
        f"{I4}except Exception:",
        f'{I8}raise _UsageError("%s: unknown element type %r; use one of %s" % (op, dtype, ", ".join(members)))'
        " from None",
        f"{I4}for name in members:",
        f"{I8}if FAMILY_TYPES.get(name) == np_name:",
        f"{I8}{I4}return name",
        f'{I4}raise _UsageError("%s has no %s variant; types: %s" % (op, np_name, ", ".join(members)))',
        "",
        "",
    ]
    for fam in ir["families"]:
        first = by_name[next(iter(fam["members"].values()))]
        pl = plan(ix, first)
        names = [pp.name for pp in pl.params]
        sig = ", ".join(["dtype"] + [n if pp.default is None else f"{n}={pp.default}"
                                     for n, pp in zip(names, pl.params, strict=True)])
        table = ", ".join(f'"{t}": {by_name[c]["python"]}' for t, c in fam["members"].items())
        lines += [
            f"_FAMILY_{fam['python']} = {{{table}}}",
            "",
            "",
            f"def {fam['python']}({sig}):",
            f'{I4}"""{fam["python"]} for the element type `dtype` (a type name or a NumPy dtype):',
            f'{I4}one of {", ".join(fam["members"])}."""',
            f"{I4}fn = _FAMILY_{fam['python']}[_type_name(dtype, _FAMILY_{fam['python']}, \"{fam['python']}\")]",
            f"{I4}return fn({', '.join(names)})",
            "",
            "",
        ]
    return lines


_CONSTANT_INIT = {"NULL", "0", "None"}


def _hoist_declarations(pre: list[str]) -> tuple[list[str], list[str]]:
    """Split `cdef T x = expr` into a declaration and, unless expr is a constant, an assignment."""
    hoisted: list[str] = []
    stmts: list[str] = []
    for line in pre:
        if not line.startswith("cdef "):
            stmts.append(line)
            continue
        decl, _, expr = line.partition(" = ")
        if not expr or expr in _CONSTANT_INIT:
            hoisted.append(line)
            continue
        # A pointer the finally clause frees must be NULL until assigned.
        hoisted.append(f"{decl} = NULL" if "*" in decl else decl)
        stmts.append(f"{decl.split()[-1].lstrip('*')} = {expr}")
    return hoisted, stmts


def python_pyx(ix: Index) -> str:
    ir = ix.ir
    lib = ix.lib
    lines = [
        "# cython: language_level=3",
        f'"""Flat bindings for {ir["pretty"]} {ir["version"]}: every host function of the pinned headers.',
        "",
        "Handles are ints; enums are IntEnum (plain ints accepted); structs are classes with",
        "attribute access. Output parameters are returned. Errors raise the library's",
        f'{ir["status"]["error_base"]} subclasses from mpbind.errors.',
        '"""',
        "",
        "from cpython.buffer cimport PyBuffer_FillInfo",
        "from cpython.mem cimport PyMem_Free, PyMem_Malloc",
        "from libc.stdint cimport intptr_t",
        "from libc.string cimport memcpy, memset",
        "",
        f"from mpbind.bindings.cy{lib} cimport *",
        "",
        *(["import struct as _struct"] if ir.get("typed_attributes") else []),
        "from enum import IntEnum as _IntEnum",
        "from typing import NewType as _NewType",
        "",
        "from mpbind.errors import UsageError as _UsageError  # first: it loads mpbind._status",
        "from mpbind import _status",
        "",
        "",
    ]
    # constants
    for c in ir["constants"]:
        lines.append(f"{_const_name(ix, c['name'])} = {c['value']!r}")
    lines.append("")
    for cname, py in sorted(ix.handles.items()):
        lines.append(f'{py} = _NewType("{py}", int)  # {cname}')
        # NewType takes its module from the caller's frame, which Cython lacks.
        lines.append(f"{py}.__module__ = __name__")
    lines += ["", ""]
    for e in ir["enums"]:
        lines.append(f"class {e['python']}(_IntEnum):")
        lines.append(f'{I4}"""{e["name"]}"""')
        for _, py, v in e["members"]:
            lines.append(f"{I4}{py} = {v}")
        lines += ["", ""]
    lines += [
        "cdef object _enum_or_int(cls, long long value):",
        f"{I4}try:",
        f"{I8}return cls(value)",
        f"{I4}except ValueError:",
        f"{I8}return value",
        "",
        "",
        "cdef object _str_or_none(const char* s):",
        f"{I4}return None if s == NULL else (<bytes>s).decode(errors=\"replace\")",
        "",
        "",
        "cdef bytes _to_bytes(object value, str what):",
        f"{I4}if isinstance(value, str):",
        f"{I8}return (<str>value).encode()",
        f"{I4}if isinstance(value, bytes):",
        f"{I8}return <bytes>value",
        f'{I4}raise TypeError("%s must be str or bytes, not %s" % (what, type(value).__name__))',
        "",
        "",
    ]
    se = ir["status"]
    lines += [
        "cdef int _raise_error(int status, str function) except -1:",
        f"{I4}description = None",
        f"{I4}last = None",
    ]
    if se.get("error_string"):
        lines += [
            f"{I4}try:",
            f"{I8}description = _str_or_none({se['error_string']}(<{se['type']}>status))",
            f"{I4}except Exception:",
            f"{I8}pass",
        ]
    if se.get("last_error"):
        lines += [
            f"{I4}try:",
            f"{I8}last = _str_or_none({se['last_error']}(NULL))",
            f"{I4}except Exception:",
            f"{I8}pass",
        ]
    lines += [
        f'{I4}raise _status.make_error("{lib}", function, status, description, last)',
        "",
        "",
        "def _raise_status(int status, str function):",
        f'{I4}"""Raise the typed error for `status` returned by `function` (used by mpbind._core)."""',
        f"{I4}_raise_error(status, function)",
        "",
        "",
    ]
    if any(p.get("convert") == "mpi_comm" for f in ix.bound for p in f["params"]):
        lines += [
            "cdef intptr_t _convert_mpi_comm(object comm) except? 0:",
            f'{I4}"""The address of an MPI_Comm: an int, an mpi4py communicator, or None (NULL)."""',
            f"{I4}if comm is None:",
            f"{I8}return 0",
            f"{I4}if isinstance(comm, int):",
            f"{I8}return comm",
            f"{I4}try:",
            f"{I8}from mpi4py import MPI",
            f"{I4}except ImportError:",
            f'{I8}raise TypeError("mpi_comm must be an int address or an mpi4py communicator") from None',
            f"{I4}if not isinstance(comm, MPI.Comm):",
            f'{I8}raise TypeError("mpi_comm must be an int address or an mpi4py communicator, not %s"'
            f" % type(comm).__name__)",
            f"{I4}return MPI._addressof(comm)",
            "",
            "",
        ]
    structs, _, _ = ix.reachable_types()
    for name in structs:
        lines += _struct_class(ix, ix.structs[name])
        s = ix.structs[name]
        cls = s["python"]
        lines.append(f"cdef object _as_{cls}(object value, str what):")
        lines.append(f"{I4}if isinstance(value, {cls}):")
        lines.append(f"{I8}return value")
        if s.get("kind") == "bytes":
            lines.append(f"{I4}if isinstance(value, (bytes, bytearray, memoryview)):")
            lines.append(f"{I8}return {cls}(value)")
        lines.append(f'{I4}raise TypeError("%s must be {cls}, not %s" % (what, type(value).__name__))')
        lines += ["", ""]
    if ir.get("inline_support"):
        lines += ["# Support code from the spec (static inline functions, converters)."]
        lines += ir["inline_support"].strip("\n").split("\n") + ["", ""]
    for f in ix.bound:
        if "inline_body" in f:
            lines += _inline_function(f)
        else:
            lines += _function(ix, plan(ix, f))
    if ir.get("families"):
        lines += _families(ix)
    for enum_name, ta in ir.get("typed_attributes", {}).items():
        lines += _typed_attribute(ix, enum_name, ta)
    text = "\n".join(lines)
    return "\n".join(line.rstrip() for line in text.split("\n")).rstrip() + "\n"
