"""Kernels that call NVSHMEM, on a machine without a GPU: the ring-exchange kernel of
examples/ring_exchange.py really compiles (NVRTC) and links (nvJitLink, against the wheel's
libnvshmem_device.a) into a cubin that defines the kernel and NVSHMEM's device state; the cache
returns it without compiling; bad sources, bad options and bad arguments raise typed errors."""

from __future__ import annotations

import importlib.util
import os
import pickle
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cuda.core", reason="cuda-core is not installed (pip install 'mpbind[kernels]')")

import mpbind  # noqa: E402
from mpbind import kernels as nk  # noqa: E402
from mpbind.errors import KernelBuildError, MpbindError, UsageError  # noqa: E402
from mpbind.kernels import _build as _kernel_build  # noqa: E402

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EM_CUDA = 190
# Compiles in about a second (no NVSHMEM header), still linked against the device library.
SMALL = 'extern "C" __global__ void scale(float* x, float a, int n) { int i = threadIdx.x; if (i < n) x[i] *= a; }'


def _example(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("kernel-cache")
    old = os.environ.get(_kernel_build.CACHE_ENV)
    os.environ[_kernel_build.CACHE_ENV] = str(folder)
    yield folder
    if old is None:
        del os.environ[_kernel_build.CACHE_ENV]
    else:
        os.environ[_kernel_build.CACHE_ENV] = old


@pytest.fixture(scope="module")
def ring(cache: Path) -> nk.Cubin:
    """The example's ring kernel, compiled and linked for sm_90 (about a minute on two cores)."""
    return nk.compile(_example("ring_exchange").SOURCE, name="ring_exchange", arch="sm_90")


# --- the real build --------------------------------------------------------------------------


def test_the_ring_kernel_compiles_and_links_into_a_cubin(ring: nk.Cubin) -> None:
    code = ring.code
    assert code[:4] == b"\x7fELF" and code[4] == 2  # a 64-bit ELF
    assert struct.unpack_from("<H", code, 0x12)[0] == EM_CUDA
    assert ring.arch == "sm_90" and not ring.cached
    assert ring.kernels == ("ring_exchange",)
    # NVSHMEM's device library is linked in: its device state is defined in the cubin.
    assert {"nvshmemi_device_state_d", "nvshmemi_device_lib_version_d"} <= set(ring.variables)
    assert ring.uses_nvshmem


def test_the_cache_returns_the_cubin_without_compiling(ring: nk.Cubin, cache: Path) -> None:
    assert any(cache.rglob("*")), "nothing was written to the cache folder"
    t0 = time.perf_counter()
    again = nk.compile(_example("ring_exchange").SOURCE, name="ring_exchange", arch="sm_90")
    assert time.perf_counter() - t0 < 5
    assert again.cached and again.code == ring.code and again.key == ring.key


def test_a_kernel_without_nvshmem_calls_links_too(cache: Path) -> None:
    cubin = nk.compile(SMALL, name="scale", arch="sm_90")
    assert cubin.kernels == ("scale",)  # the device library adds no kernel of its own
    assert cubin.uses_nvshmem  # but its device state, so that loading registers it alike


def test_the_key_follows_options_architecture_and_source(cache: Path) -> None:
    base = nk.compile(SMALL, name="scale", arch="sm_90")
    keys = {base.key,
            nk.compile(SMALL, name="scale", arch="sm_100").key,
            nk.compile(SMALL, name="scale", arch="sm_90", defines=["EXTRA=1"]).key,
            nk.compile(SMALL + "\n", name="scale", arch="sm_90").key}
    assert len(keys) == 4
    assert nk.compile(SMALL, name="scale", arch="sm_90").cached
    fresh = nk.compile(SMALL, name="scale", arch="sm_90", cache=False)
    assert not fresh.cached and fresh.kernels == base.kernels


def test_a_header_of_an_include_folder_is_part_of_the_key(cache: Path, tmp_path: Path) -> None:
    header = tmp_path / "factor.h"
    header.write_text("#define FACTOR 2\n")
    source = '#include "factor.h"\n' + SMALL.replace("*= a", "*= a * FACTOR")
    first = nk.compile(source, name="scale", arch="sm_90", include_dirs=[str(tmp_path)])
    header.write_text("#define FACTOR 3\n")
    os.utime(header, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert not nk.compile(source, name="scale", arch="sm_90", include_dirs=[str(tmp_path)]).key == first.key


# --- errors carry the compiler's and the linker's logs ---------------------------------------


def test_a_compile_error_carries_the_nvrtc_log(cache: Path) -> None:
    with pytest.raises(KernelBuildError) as info:
        nk.compile('extern "C" __global__ void k() { undefined_thing(); }', name="broken", arch="sm_90")
    err = info.value
    assert err.stage == "compile" and err.name == "broken" and err.arch == "sm_90"
    assert "undefined_thing" in err.log and "undefined_thing" in str(err)
    assert isinstance(err, MpbindError)
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.stage, copy.log) == (err.stage, err.log)


def test_a_link_error_carries_the_nvjitlink_log(cache: Path) -> None:
    source = ('extern "C" __device__ void nowhere_defined(float*);\n'
              'extern "C" __global__ void k(float* x) { nowhere_defined(x); }')
    with pytest.raises(KernelBuildError) as info:
        nk.compile(source, name="unresolved", arch="sm_90")
    assert info.value.stage == "link"
    assert "nowhere_defined" in info.value.log


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"arch": "90"}, "arch must be like"),
    ({"arch": "sm_90", "include_path": ["x"]}, "set by the build itself"),
    ({"arch": "sm_90", "not_an_option": True}, "ProgramOptions"),
    ({"arch": "sm_90", "name": ""}, "name must be"),
])
def test_bad_build_arguments_are_refused(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        nk.compile(SMALL, **kwargs)


def test_an_empty_source_is_refused() -> None:
    with pytest.raises(UsageError, match="source"):
        nk.compile("  ")


def test_the_error_is_exported() -> None:
    import mpbind.errors as errors

    assert "KernelBuildError" in errors.__all__


# --- the toolchain -----------------------------------------------------------------------------


def test_the_toolchain_is_the_installed_wheels() -> None:
    tools = _kernel_build.toolchain()
    assert tools.device_library.is_file()
    assert (tools.nvshmem_include / "nvshmem.h").is_file()
    assert tools.nvshmem_version.count(".") == 2 and "?" not in tools.nvshmem_version


@pytest.fixture(scope="module")
def nvshmem_345(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """NVSHMEM 3.4.5's headers and device library (the release PyTorch's CUDA 13 wheels bring), from
    its wheel on the package index: include/ and lib/libnvshmem_device.a, as an NVSHMEM home."""
    import subprocess
    import sys
    import zipfile

    folder = tmp_path_factory.mktemp("nvshmem-3.4.5")
    got = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                          "--dest", str(folder), "nvidia-nvshmem-cu13==3.4.5"], capture_output=True, text=True,
                         timeout=600)
    wheels = list(folder.glob("nvidia_nvshmem_cu13-3.4.5-*.whl"))
    if got.returncode != 0 or not wheels:
        pytest.skip(f"nvidia-nvshmem-cu13 3.4.5 could not be downloaded: {got.stderr.strip()[-300:]}")
    with zipfile.ZipFile(wheels[0]) as z:
        members = [m for m in z.namelist()
                   if m.startswith("nvidia/nvshmem/include/") or m == "nvidia/nvshmem/lib/libnvshmem_device.a"]
        z.extractall(folder, members)
    return folder / "nvidia" / "nvshmem"


@pytest.mark.parametrize("which", ["ring", "collective_matmul"])
def test_kernels_build_against_nvshmem_3_4_5(which: str, nvshmem_345: Path, cache: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # Its headers as they stand do not build under NVRTC (rdma-core's infiniband/mlx5dv.h, std:: type
    # traits, a host-only constructor): the legacy prelude makes them.
    from mpbind.collective import KERNEL_SOURCE

    monkeypatch.setenv(_kernel_build.HOME_ENV, str(nvshmem_345))
    tools = _kernel_build.toolchain()
    assert tools.nvshmem_home == nvshmem_345 and tools.nvshmem_version == "3.4.5" and tools.legacy
    source = _example("ring_exchange").SOURCE if which == "ring" else KERNEL_SOURCE
    cubin = nk.compile(source, name=f"{which}_345", arch="sm_90")
    assert cubin.kernels == (("ring_exchange",) if which == "ring" else ("ag_ring",))
    assert {"nvshmemi_device_state_d", "nvshmemi_device_lib_version_d"} <= set(cubin.variables)
    with pytest.raises(KernelBuildError, match=r"bad_345\(2\): error: identifier \"oops\" is undefined"):
        nk.compile("// line 1\n__global__ void k() { oops; }", name="bad_345", arch="sm_90")


def test_only_nvshmem_before_3_5_takes_the_legacy_prelude() -> None:
    def legacy(version: str) -> bool:
        return _kernel_build.Toolchain(Path("/"), Path("/"), Path("/"), version).legacy

    assert legacy("3.4.5") and legacy("3.0.6") and legacy("2.11.0")
    assert not legacy("3.5.0") and not legacy("3.9.2") and not legacy("4.0.0") and not legacy("?.?.?")
    assert not _kernel_build.toolchain().legacy  # the installed wheel (the pinned release): built as it always was


def test_an_nvshmem_home_without_the_device_library_is_passed_over(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_kernel_build.HOME_ENV, str(tmp_path))
    assert _kernel_build.toolchain().nvshmem_home != tmp_path


def test_the_cache_folder_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(_kernel_build.CACHE_ENV, str(tmp_path / "k"))
    assert _kernel_build.cache_dir() == tmp_path / "k"
    monkeypatch.delenv(_kernel_build.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert _kernel_build.cache_dir() == tmp_path / "mpbind" / "kernels"


# --- declared parameters and arguments, checked before any launch ------------------------------


class FakeDeviceArray:
    """A device array as the CUDA array interface describes it (nothing is dereferenced)."""

    def __init__(self, ptr: int, n: int, typestr: str = "<f4") -> None:
        self.__cuda_array_interface__ = {"version": 3, "shape": (n,), "typestr": typestr, "data": (ptr, False),
                                         "strides": None, "stream": None}


HEAP = (0x7F0000000000, 1 << 20)


def in_heap(ptr: int, nbytes: int) -> bool:
    return HEAP[0] <= ptr and ptr + nbytes <= HEAP[0] + HEAP[1]


PARAMS = (nk.symmetric("dst", "float32"), nk.pointer("src", "float32"), nk.value("n", "size_t"),
          nk.value("scale", "float"))


def test_parameters_take_c_spellings() -> None:
    assert nk.value("n", "size_t").dtype == "uint64"
    assert nk.value("n", "unsigned long long").dtype == "uint64"
    assert nk.value("i", "int").dtype == "int32"
    assert nk.value("x", "double").nbytes == 8 and nk.value("x", "float").nbytes == 4
    assert nk.pointer("p").nbytes == 8 and nk.symmetric("p", "float16").dtype == "float16"
    with pytest.raises(UsageError, match="unknown C type"):
        nk.value("n", "long double")
    with pytest.raises(UsageError, match="identifier"):
        nk.pointer("not a name")


def test_arguments_are_converted_for_the_launch() -> None:
    import ctypes

    dst = FakeDeviceArray(HEAP[0] + 4096, 16)
    src = FakeDeviceArray(0x10000, 16)
    out = nk._prepare(PARAMS, (dst, src, 16, 0.5), heap=in_heap)
    assert out[0] == HEAP[0] + 4096 and out[1] == 0x10000
    assert isinstance(out[2], ctypes.c_uint64) and out[2].value == 16
    assert isinstance(out[3], ctypes.c_float) and out[3].value == 0.5
    # Addresses are taken as they are; a symmetric one must still lie in the heap.
    assert nk._prepare(PARAMS, (HEAP[0], 0x10000, 1, 1), heap=in_heap)[:2] == [HEAP[0], 0x10000]


class IndexableArray:
    """An array type that also defines __index__, as PyTorch's tensors do (raising for several elements),
    with its interface a property of the type, as theirs is."""

    def __init__(self, ptr: int, n: int) -> None:
        self._described = FakeDeviceArray(ptr, n).__cuda_array_interface__

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return self._described

    def __index__(self) -> int:
        raise TypeError("only integer tensors of a single element can be converted to an index")


def test_an_array_with_index_is_a_pointer_not_an_int() -> None:
    out = nk._prepare(PARAMS, (IndexableArray(HEAP[0], 16), IndexableArray(0x10000, 16), 16, 0.5), heap=in_heap)
    assert out[:2] == [HEAP[0], 0x10000]
    with pytest.raises(UsageError, match="not in NVSHMEM's symmetric"):
        nk._prepare(PARAMS, (IndexableArray(0x10000, 16), 0x20000, 16, 1.0), heap=in_heap)


@pytest.mark.parametrize(("args", "error", "match"), [
    ((FakeDeviceArray(0x10000, 16), FakeDeviceArray(0x20000, 16), 16, 1.0), UsageError, "not in NVSHMEM's symmetric"),
    ((0x10000, 0x20000, 16, 1.0), UsageError, "declared symmetric"),
    # The array starts in the heap but runs past its end.
    ((FakeDeviceArray(HEAP[0] + HEAP[1] - 8, 16), 0x20000, 16, 1.0), UsageError, "symmetric heap"),
    ((FakeDeviceArray(HEAP[0], 16, "<f8"), 0x20000, 16, 1.0), UsageError, "declared float32"),
    ((HEAP[0], 0x20000, -1, 1.0), UsageError, "does not fit uint64"),
    ((HEAP[0], 0x20000, 2**64, 1.0), UsageError, "does not fit uint64"),
    ((HEAP[0], 0x20000, 1.5, 1.0), TypeError, "is an uint64"),
    ((HEAP[0], 0x20000, True, 1.0), TypeError, "is an uint64"),
    ((HEAP[0], 0x20000, 1, "x"), TypeError, "is a float32"),
    ((HEAP[0], -5, 1, 1.0), UsageError, "address"),
    ((HEAP[0], 0x20000, 1), TypeError, "takes 4 arguments"),
])
def test_bad_arguments_are_refused_before_the_launch(args: tuple[Any, ...], error: type[Exception],
                                                     match: str) -> None:
    with pytest.raises(error, match=match):
        nk._prepare(PARAMS, args, heap=in_heap)


def test_grid_and_block_shapes_are_checked() -> None:
    assert nk._dims(4, "grid") == (4, 1, 1)
    assert nk._dims((2, 3), "grid") == (2, 3, 1)
    with pytest.raises(UsageError, match="positive"):
        nk._dims(0, "block")
    with pytest.raises(TypeError, match="up to 3"):
        nk._dims((1, 2, 3, 4), "block")


def test_loading_needs_the_runtime(ring: nk.Cubin) -> None:
    from mpbind import nvshmem

    if nvshmem.is_initialized():
        pytest.skip("an NVSHMEM runtime is live in this process")
    with pytest.raises(UsageError, match="initialise"):
        ring.load()


def test_libraries_come_only_from_load() -> None:
    with pytest.raises(TypeError, match="load"):
        nk.Library()


def test_kernels_come_only_from_a_library() -> None:
    with pytest.raises(TypeError, match=r"Library\.kernel\(\)"):
        nk.Kernel()


@pytest.mark.parametrize(("args", "error", "match"), [
    ((0, "value", "int32"), UsageError, "identifier"),
    (("n", "value", None), TypeError, "a C type is a string"),
    (("n", "value", "long double"), UsageError, "unknown C type"),
    (("p", "array", None), UsageError, "kind must be 'value', 'pointer' or 'symmetric'"),
    (("p", "pointer", "no such type"), UsageError, "parameter 'p'"),
])
def test_parameters_made_by_hand_are_checked(args: tuple[Any, ...], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        nk.Param(*args)


def test_parameters_made_by_hand_take_c_spellings() -> None:
    assert nk.Param("n", "value", "size_t") == nk.value("n", "uint64")
    assert nk.Param("p", "symmetric") == nk.symmetric("p")


@pytest.mark.parametrize(("field", "bad", "match"), [
    ("code", "cubin", "code must be the cubin's bytes"),
    ("code", b"", "code must be the cubin's bytes"),
    ("name", None, "name must be a str"),
    ("kernels", ["k"], "kernels must be a tuple"),
    ("variables", (0,), "variables must be a tuple"),
    ("cached", 0, "cached must be a bool"),
])
def test_cubins_made_by_hand_are_checked(field: str, bad: Any, match: str) -> None:
    fields = {"code": b"\x7fELF", "name": "k", "arch": "sm_90", "kernels": ("k",), "variables": (), "key": "0",
              "cached": False, "log": ""}
    nk.Cubin(**fields)
    with pytest.raises(TypeError, match=match):
        nk.Cubin(**{**fields, field: bad})


def test_drain_is_the_process_drain() -> None:
    # Kernel libraries are rows of the core's lifetime table (tests/core/test_lifetimes.py): no queue of
    # their own, one drain.
    assert nk.drain is mpbind.drain
    assert nk.drain() == 0
