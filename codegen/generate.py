"""mpbind's binding generator.

    python codegen/generate.py                 parse the pinned headers, write IR and bindings
    python codegen/generate.py --from-ir       render the bindings from the checked-in IR only
    python codegen/generate.py --check         fail on a stale or hand-edited generated file,
                                                and (where the pinned header wheel and libclang
                                                are installed) on an IR the headers no longer match
    python codegen/generate.py --lib nccl ...  restrict to some libraries
    python codegen/generate.py --lib nccl --headers DIR --release 2.28.9 --out DIR
                                                the bindings of another release, from its headers in
                                                DIR, written under --out (not into the repository)
    python codegen/generate.py --lib cufftmp --headers DIR --release 11.4.0.6 --layouts
                                                record that release's struct layouts, enum values and
                                                prototypes in codegen/layouts/<lib>.json (a release a
                                                wheel family installs under the same bindings) and say
                                                where they differ from the pinned ones

Headers come from the pinned nvidia-* wheel installed in the running interpreter
(versions in codegen/versions.toml, which --check also compares with pyproject.toml's pins).
Which functions a release exports, and the release that first exported each, come from the
symbol record codegen/symbols/<lib>.json (codegen/since.py).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata as md
import json
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import emit_core  # noqa: E402
import emit_cython  # noqa: E402
import emit_python  # noqa: E402
import emit_shared  # noqa: E402
import emit_status  # noqa: E402
import emit_stubs  # noqa: E402
import layouts  # noqa: E402
import since  # noqa: E402
import versions  # noqa: E402
from emit_common import body_digest, seal, unseal  # noqa: E402
from ir_types import Library  # noqa: E402
from model import ROOT, Spec, build_ir  # noqa: E402

REPO = ROOT.parent
SRC = REPO / "src" / "mpbind"
LIBRARIES = ["nccl", "nvshmem", "cublasmp", "cufftmp"]


def ir_path(lib: str) -> Path:
    return ROOT / "ir" / f"{lib}.json"


def load_ir(lib: str) -> dict[str, Any]:
    return json.loads(ir_path(lib).read_text())


def load_library(lib: str) -> Library:
    """The typed IR of one library, as the emitters read it."""
    return Library.from_json(load_ir(lib))


def dump_ir(ir: dict[str, Any]) -> str:
    return json.dumps(ir, indent=1, sort_keys=False) + "\n"


def header_dir(spec: Spec, pinned: str) -> tuple[Path | None, str]:
    """The include dir of the pinned wheel in this interpreter, or why there is none."""
    try:
        dist = md.distribution(spec.wheel)
    except md.PackageNotFoundError:
        return None, f"{spec.wheel} is not installed"
    if dist.version != pinned:
        return None, f"{spec.wheel} {dist.version} is installed, the pin is {pinned}"
    path = Path(str(dist.locate_file(spec.include_subdir)))
    if not path.is_dir():
        return None, f"{spec.wheel} has no {spec.include_subdir}"
    return path, ""


def headers_digest(include: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(include.rglob("*.h")):
        h.update(str(p.relative_to(include)).encode())
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def parse_lib(lib: str) -> tuple[dict[str, Any] | None, str]:
    """The IR of the pinned release, from the wheel installed in this interpreter."""
    spec = Spec.load(lib)
    version = versions.load()[lib].version
    include, why = header_dir(spec, version)
    if include is None:
        return None, why
    parsed, why = parse_headers(spec, include)
    if parsed is None:
        return None, why
    binary = Path(str(md.distribution(spec.wheel).locate_file(spec.binary)))
    # The functions it exports, read as the symbol record reads every release (codegen/since.py).
    return make_ir(spec, parsed, include, version, since.exported_functions(binary, spec.prefixes)), ""


def parse_headers(spec: Spec, include: Path) -> tuple[dict[str, Any] | None, str]:
    """The spec's headers in `include` as parsed, or why they cannot be."""
    try:
        import parse
    except ImportError as exc:
        return None, f"libclang is not installed ({exc})"
    from cuda.pathfinder import find_nvidia_header_directory

    cuda_inc = find_nvidia_header_directory("cudart")
    extra = []
    for wheel, subdir in spec.extra_includes:
        try:
            extra.append(Path(str(md.distribution(wheel).locate_file(subdir))))
        except md.PackageNotFoundError:
            return None, f"{wheel} (headers {spec.name} includes) is not installed"
    return parse.HeaderParser(spec, include, cuda_inc, extra).parse(), ""


def make_ir(spec: Spec, parsed: dict[str, Any], include: Path, version: str, exports: set[str]) -> dict[str, Any]:
    import parse

    shas = {h: parse.sha256_of(include / h) for h in spec.headers}
    # Where the exported functions the parse did not declare are declared, if anywhere.
    undeclared = exports - {f["name"] for f in parsed["functions"]}
    parsed = {**parsed, "elsewhere": parse.declaring_headers(include, undeclared)}
    ir = build_ir(spec, parsed, version, shas, exports)
    ir["headers_digest"] = headers_digest(include)
    return ir


def release_ir(lib: str, include: Path, release: str) -> tuple[dict[str, Any], list[str], list[str]]:
    """The IR of another release from its headers in `include`: (IR, the spec's headers that
    release lacks, the functions the spec names that its headers do not declare).

    Its exports are the record's (codegen/symbols/<lib>.json). What the spec says about
    functions of later releases is left out, not an error, so the same spec serves both."""
    record = since.load_record(lib)
    if release not in record.exports:
        raise SystemExit(f"{lib} {release} is not in codegen/symbols/{lib}.json "
                         f"(python codegen/since.py update {lib} --release {release})")
    spec = Spec.load(lib)
    missing = [h for h in spec.headers if not (include / h).is_file()]
    text = "\n".join(p.read_text(errors="replace") for p in sorted(include.rglob("*.h")))
    spec = replace(spec, headers=[h for h in spec.headers if h not in missing],
                   initializers={s: m for s, m in spec.initializers.items()
                                 if re.search(rf"#\s*define\s+{re.escape(m)}\b", text)})
    parsed, why = parse_headers(spec, include)
    if parsed is None:
        raise SystemExit(f"{lib}: {why}")
    declared = {f["name"] for f in parsed["functions"]}
    absent = sorted({*spec.functions, *spec.gil_keep, *spec.inline} - declared)
    spec = replace(spec, functions={k: v for k, v in spec.functions.items() if k in declared},
                   gil_keep=spec.gil_keep & declared, inline={k: v for k, v in spec.inline.items() if k in declared})
    return make_ir(spec, parsed, include, release, record.exports[release]), missing, absent


def write_release(lib: str, include: Path, release: str, out: Path) -> int:
    ir, missing, absent = release_ir(lib, include, release)
    files = {ROOT / "ir" / f"{lib}.json": dump_ir(ir), **render({lib: ir})}
    for path, text in files.items():
        target = out / path.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    print(f"{lib} {release}: {sum('excluded' not in f for f in ir['functions'])} bound, "
          f"{sum('excluded' in f for f in ir['functions'])} excluded; {len(files)} files under {out}")
    for h in missing:
        print(f"missing header: {h}")
    for name in absent:
        print(f"not declared: {name}")
    return 0


def write_layouts(lib: str, include: Path, release: str) -> int:
    ir, _, _ = release_ir(lib, include, release)
    record = layouts.of(Library.from_json(ir))
    target = layouts.write(lib, release, record, f"codegen/generate.py --lib {lib} --headers DIR --release "
                                                 f"{release} --layouts")
    problems, notes = layouts.compare(load_library(lib), release, record)
    print(f"{lib} {release}: recorded in {target.relative_to(REPO)}")
    for line in notes:
        print(f"note: {line}")
    for line in problems:
        print(f"error: {line}")
    return 1 if problems else 0


def render(irs: dict[str, dict[str, Any]]) -> dict[Path, str]:
    """Every generated file, path -> sealed text, from the IR documents by library."""
    out: dict[Path, str] = {}
    libs = {name: Library.from_json(ir) for name, ir in irs.items()}
    for name, lib in libs.items():
        b = SRC / "bindings"
        out[b / f"cy{name}.pxd"] = seal(emit_cython.cy_pxd(lib), "#", lib.source)
        out[b / f"cy{name}.pyx"] = seal(emit_cython.cy_pyx(lib), "#", lib.source)
        out[b / "_internal" / f"{name}.pxd"] = seal(emit_cython.internal_pxd(lib), "#", lib.source)
        out[b / "_internal" / f"{name}.pyx"] = seal(emit_cython.internal_pyx(lib), "#", lib.source)
        for module, text in emit_python.python_modules(lib).items():
            out[b / f"{module}.pyx"] = seal(text, "#", lib.source)
        out[b / f"{name}.pyi"] = seal(emit_stubs.stub(lib), "#", lib.source)
    out[SRC / "bindings" / "_common.pxd"] = seal(emit_shared.common_pxd(), "#", emit_shared.SOURCE)
    out[SRC / "bindings" / "_common.pyx"] = seal(emit_shared.common_pyx(), "#", emit_shared.SOURCE)
    every = [libs[name] for name in LIBRARIES if name in libs]
    agg = "codegen/ir/*.json (every library as pinned)"
    out[SRC / "bindings" / "_status.py"] = seal(emit_status.status_py(every), "#", agg)
    out[SRC / "bindings" / "_coverage.py"] = seal(emit_status.coverage_py(every), "#", agg)
    for name, (body, origin) in emit_core.headers(libs).items():
        out[SRC / "bindings" / "_core_abi" / name] = seal(body, "//", origin)
    return out


def check(libs: list[str]) -> int:
    problems: list[str] = []
    irs = {lib: load_ir(lib) for lib in LIBRARIES}
    for path, text in render(irs).items():
        rel = path.relative_to(REPO)
        if not path.exists():
            problems.append(f"{rel}: missing (run codegen/generate.py --from-ir)")
            continue
        on_disk = path.read_text()
        digest, body = unseal(on_disk)
        if digest is None:
            problems.append(f"{rel}: has no generated-file header")
        elif digest != body_digest(body):
            problems.append(f"{rel}: edited by hand (its seal does not match its body)")
        elif on_disk != text:
            problems.append(f"{rel}: stale (the IR or the generator changed; regenerate)")
    problems += versions.problems()
    pins = versions.load()
    problems += layouts.problems({lib: Library.from_json(ir) for lib, ir in irs.items()},
                                 {lib: [w.release for w in pin.others.values()] for lib, pin in pins.items()})
    problems += [f"codegen/ir/{lib}.json: {ir['version']}, but codegen/versions.toml pins {pins[lib].version} "
                 "(run codegen/generate.py)" for lib, ir in irs.items() if ir["version"] != pins[lib].version]
    for lib in libs:
        fresh, why = parse_lib(lib)
        if fresh is None:
            print(f"note: {lib}: headers not checked: {why}")
            continue
        if dump_ir(fresh) != dump_ir(irs[lib]):
            problems.append(f"codegen/ir/{lib}.json: does not match the pinned headers and spec "
                            "(run codegen/generate.py)")
        else:
            print(f"{lib}: IR matches the pinned headers and spec")
    for p in problems:
        print(f"error: {p}")
    if not problems:
        print(f"ok: {len(render(irs))} generated files are current")
    return 1 if problems else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--from-ir", action="store_true")
    ap.add_argument("--lib", action="append", choices=LIBRARIES)
    ap.add_argument("--headers", type=Path, help="another release's include folder (with --release, --out)")
    ap.add_argument("--release", help="the release whose headers --headers holds")
    ap.add_argument("--out", type=Path, help="where that release's IR and bindings are written")
    ap.add_argument("--layouts", action="store_true",
                    help="record that release's layouts in codegen/layouts/ (with --headers, --release)")
    a = ap.parse_args()
    libs = a.lib or LIBRARIES
    if a.headers or a.release or a.out or a.layouts:
        if not (a.headers and a.release and (a.out or a.layouts)) or len(libs) != 1:
            ap.error("--headers and --release go with --out or --layouts, and one --lib")
        if a.layouts:
            return write_layouts(libs[0], a.headers, a.release)
        return write_release(libs[0], a.headers, a.release, a.out)
    if a.check:
        return check(libs)
    irs = {lib: load_ir(lib) for lib in LIBRARIES if ir_path(lib).exists()}
    if not a.from_ir:
        for lib in libs:
            ir, why = parse_lib(lib)
            if ir is None:
                print(f"error: {lib}: {why}", file=sys.stderr)
                return 1
            ir_path(lib).parent.mkdir(parents=True, exist_ok=True)
            ir_path(lib).write_text(dump_ir(ir))
            irs[lib] = ir
            print(f"{lib}: {sum('excluded' not in f for f in ir['functions'])} bound, "
                  f"{sum('excluded' in f for f in ir['functions'])} excluded")
    for path, text in render(irs).items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
