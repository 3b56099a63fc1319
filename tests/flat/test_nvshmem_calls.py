# mypy: disable-error-code="arg-type"
# (these tests pass wrongly typed arguments on purpose)
"""Real calls into libnvshmem_host that work without a GPU.

Initialisation is never attempted in this process: it runs in a child process with a
timeout, and only where no GPU is visible (it would succeed, and stay initialised, on one).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import inspect
import json
import os
import pickle
import re
import struct
import subprocess
import sys
from functools import partial
from types import TracebackType
from typing import Any

import numpy as np
import pytest

from mpbind._infra import loader as _loader
from mpbind._infra.info import gpu_count
from mpbind.bindings import _status, nvshmem
from mpbind.errors import (
    LibraryError,
    NVSHMEMError,
    NVSHMEMNotInitializedError,
    NVSHMEMOutOfMemoryError,
    UsageError,
)

UID_BYTES = 128
NOT_ERRORS = {"SUCCESS", "ERROR_SENTINEL"}
V1 = 1 << 16
V2 = 2 << 16
# The reproduced static inline init's helper (module-private, so not in the stubs).
_set_attr_versions = nvshmem._set_attr_versions  # type: ignore[attr-defined]


def _installed(wheel: str) -> str | None:
    try:
        return importlib.metadata.version(wheel)
    except importlib.metadata.PackageNotFoundError:
        return None


def _lib() -> ctypes.CDLL:
    return ctypes.CDLL(_loader.load("nvshmem").path)


# --- versions ------------------------------------------------------------------------------


def test_vendor_version_matches_ctypes() -> None:
    version = nvshmem.vendor_get_version_info()
    assert isinstance(version, tuple) and len(version) == 3
    out = [ctypes.c_int(-1) for _ in range(3)]
    _lib().nvshmemx_vendor_get_version_info(*(ctypes.byref(v) for v in out))
    assert version == tuple(v.value for v in out)


def test_vendor_version_of_pinned_wheel(pins: dict[str, Any], installed: dict[str, Any]) -> None:
    pin = installed["nvshmem"]  # the library of this environment's wheel family
    if _installed(pin.wheel) != pin.version:
        pytest.skip(f"{pin.wheel} {pin.version} is not installed (found {_installed(pin.wheel)})")
    if not _loader.load("nvshmem").path.endswith("nvidia/nvshmem/lib/libnvshmem_host.so.3"):
        pytest.skip("libnvshmem_host is not loaded from the wheel here")
    assert nvshmem.vendor_get_version_info() == pin.parts
    # the constants are the headers' the bindings are generated from
    assert (nvshmem.VENDOR_MAJOR_VERSION, nvshmem.VENDOR_MINOR_VERSION,
            nvshmem.VENDOR_PATCH_VERSION) == pins["nvshmem"].parts


def test_info_get_version_is_the_openshmem_version() -> None:
    major, minor = nvshmem.info_get_version()
    out = [ctypes.c_int(-1), ctypes.c_int(-1)]
    _lib().nvshmem_info_get_version(ctypes.byref(out[0]), ctypes.byref(out[1]))
    assert (major, minor) == (out[0].value, out[1].value)
    assert (major, minor) == (nvshmem.MAJOR_VERSION, nvshmem.MINOR_VERSION)


def test_info_get_name() -> None:
    name = nvshmem.info_get_name()
    assert isinstance(name, str)
    assert "{}.{}.{}".format(*nvshmem.vendor_get_version_info()) in name
    buf = ctypes.create_string_buffer(nvshmem.MAX_NAME_LEN)
    _lib().nvshmem_info_get_name(buf)
    assert name == buf.value.decode()


def test_init_status_before_init() -> None:
    # NVSHMEM documents NVSHMEM_STATUS_NOT_INITIALIZED before nvshmem_init.
    status = nvshmem.init_status()
    assert type(status) is int
    assert status == 0
    assert nvshmem.InitStatus(status) is nvshmem.InitStatus.NOT_INITIALIZED
    assert nvshmem.id_init_status() == status


# --- unique id -----------------------------------------------------------------------------


def test_get_uniqueid_works_without_a_gpu() -> None:
    uid = nvshmem.get_uniqueid()
    assert isinstance(uid, nvshmem.UniqueId)
    assert len(uid) == uid.nbytes == UID_BYTES
    raw = bytes(uid)
    assert len(raw) == UID_BYTES
    # The first field is the struct version, (1 << 16) + sizeof(nvshmemx_uniqueid_v1).
    assert struct.unpack_from("<i", raw)[0] == V1 + UID_BYTES
    assert raw != bytes(nvshmem.UniqueId())
    assert ctypes.string_at(uid.ptr, UID_BYTES) == raw
    assert memoryview(uid).tobytes() == raw


def test_unique_ids_differ() -> None:
    a, b = nvshmem.get_uniqueid(), nvshmem.get_uniqueid()
    assert a != b
    assert bytes(a) != bytes(b)


def test_unique_id_pickles() -> None:
    uid = nvshmem.get_uniqueid()
    clone = pickle.loads(pickle.dumps(uid))
    assert type(clone) is nvshmem.UniqueId
    assert clone == uid and hash(clone) == hash(uid)
    assert nvshmem.UniqueId(bytes(uid)) == uid
    assert uid != bytes(uid)


@pytest.mark.parametrize("size", [0, 127, 129])
def test_unique_id_wrong_length(size: int) -> None:
    with pytest.raises(UsageError, match="128"):
        nvshmem.UniqueId(b"\x01" * size)


# --- init attributes ------------------------------------------------------------------------


def test_init_attr_defaults() -> None:
    attr = nvshmem.InitAttr()
    assert attr.nbytes == 144
    assert attr.version == V2 + attr.nbytes == nvshmem.INIT_ATTR_V2_IDENTIFIER
    assert attr.mpi_comm == 0
    args = attr.args
    assert args.version == V2 + args.nbytes == nvshmem.INIT_ARGS_V2_IDENTIFIER
    assert args.cuda_device_id == -1
    assert args.content == (0,) * len(args.content)
    uid_args = args.uid_args
    assert uid_args.version == V1 + uid_args.nbytes == V1 + 24
    assert (uid_args.id, uid_args.myrank, uid_args.nranks) == (0, -1, -1)


def test_set_attr_uniqueid_args_fills_attr_in_place() -> None:
    uid = nvshmem.get_uniqueid()
    attr = nvshmem.InitAttr()
    nvshmem.set_attr_uniqueid_args(0, 1, uid, attr)
    uid_args = attr.args.uid_args
    assert (uid_args.myrank, uid_args.nranks) == (0, 1)
    assert uid_args.id != 0
    assert ctypes.string_at(uid_args.id, UID_BYTES) == bytes(uid)
    assert attr.version == nvshmem.INIT_ATTR_V2_IDENTIFIER
    assert attr.args.version == nvshmem.INIT_ARGS_V2_IDENTIFIER


def test_set_attr_uniqueid_args_keeps_the_unique_id_alive() -> None:
    # attr stores a pointer to the unique id: the id it points at must live as long as attr,
    # also when the caller passes bytes or drops its UniqueId. Run apart: a dangling pointer
    # is read here.
    code = (
        "import ctypes, gc\n"
        "from mpbind.bindings import nvshmem\n"
        "uid = nvshmem.get_uniqueid(); want = bytes(uid)\n"
        "from_bytes = nvshmem.InitAttr(); nvshmem.set_attr_uniqueid_args(0, 1, want, from_bytes)\n"
        "dropped = nvshmem.InitAttr(); nvshmem.set_attr_uniqueid_args(0, 1, uid, dropped); del uid\n"
        "gc.collect(); churn = [nvshmem.UniqueId(b'\\x07' * 128) for _ in range(2000)]\n"
        "print(ctypes.string_at(from_bytes.args.uid_args.id, 128) == want,\n"
        "      ctypes.string_at(dropped.args.uid_args.id, 128) == want)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    from_bytes, dropped = proc.stdout.split()
    assert from_bytes == "True", "attr points at freed memory after set_attr_uniqueid_args(.., bytes, attr)"
    assert dropped == "True", "attr points at freed memory once the caller drops its UniqueId"


def test_set_attr_uniqueid_args_rejects_wrong_types() -> None:
    with pytest.raises(TypeError):
        nvshmem.set_attr_uniqueid_args(0, 1, "x" * UID_BYTES, nvshmem.InitAttr())
    with pytest.raises(TypeError):
        nvshmem.set_attr_uniqueid_args(0, 1, nvshmem.get_uniqueid(), object())
    with pytest.raises(UsageError):
        nvshmem.set_attr_uniqueid_args(0, 1, b"short", nvshmem.InitAttr())


def test_set_attr_mpi_comm_args_stores_the_address() -> None:
    comm = ctypes.c_void_p(0)
    attr = nvshmem.InitAttr()
    nvshmem.set_attr_mpi_comm_args(ctypes.addressof(comm), attr)
    assert attr.mpi_comm == ctypes.addressof(comm)


@pytest.mark.parametrize("value", ["MPI_COMM_WORLD", object(), 1.5])
def test_set_attr_mpi_comm_args_rejects_a_non_communicator(value: object) -> None:
    # mpi_comm is an int address or an mpi4py communicator (spec: convert = "mpi_comm"); the
    # conversion must be reached, not pre-empted by an intptr_t parameter that would also
    # reject every mpi4py communicator.
    with pytest.raises(TypeError, match="mpi4py communicator"):
        nvshmem.set_attr_mpi_comm_args(value, nvshmem.InitAttr())


# --- the reproduced static inline init ------------------------------------------------------


@pytest.mark.parametrize(("loaded", "tag"), [((3, 4, 5), V1), ((3, 8, 0), V2), ((4, 0, 0), V2)])
def test_set_attr_versions(loaded: tuple[int, int, int], tag: int) -> None:
    attr = nvshmem.InitAttr()
    if tag == V2:  # start from V1 values so that a V2 write is seen
        _set_attr_versions(attr, (3, 4, 5))
    _set_attr_versions(attr, loaded)
    assert attr.version == tag + 144
    assert attr.args.version == tag + 128
    assert attr.args.uid_args.version == V1 + 24
    if tag == V1:
        assert attr.version == nvshmem.INIT_ATTR_V1_IDENTIFIER
    else:
        assert attr.version == nvshmem.INIT_ATTR_V2_IDENTIFIER
        assert attr.args.version == nvshmem.INIT_ARGS_V2_IDENTIFIER


def test_set_attr_versions_keeps_other_fields() -> None:
    uid = nvshmem.get_uniqueid()
    attr = nvshmem.InitAttr()
    nvshmem.set_attr_uniqueid_args(3, 4, uid, attr)
    _set_attr_versions(attr, (3, 4, 5))
    uid_args = attr.args.uid_args
    assert (uid_args.myrank, uid_args.nranks, uid_args.id) == (3, 4, uid.ptr)


INIT_CASES = {
    "init": "nvshmem.init()",
    "init_thread": "nvshmem.init_thread(nvshmem.ThreadSupport.SERIALIZED)",
    "init_attr_default": "nvshmem.init_attr(0)",
    "init_attr_uniqueid": (
        "attr = nvshmem.InitAttr(); nvshmem.set_attr_uniqueid_args(0, 1, nvshmem.get_uniqueid(), attr); "
        "nvshmem.init_attr(nvshmem.InitFlags.WITH_UNIQUEID, attr)"
    ),
}


@pytest.mark.parametrize("case", sorted(INIT_CASES))
def test_init_without_gpu_fails_cleanly(case: str) -> None:
    count, _ = gpu_count()
    if count > 0:
        pytest.skip("a GPU is visible: initialisation would succeed")
    code = (
        "import json\n"
        "from mpbind.bindings import nvshmem\n"
        "from mpbind.errors import NVSHMEMError\n"
        "try:\n"
        f"    {INIT_CASES[case]}\n"
        "except NVSHMEMError as e:\n"
        "    print(json.dumps([type(e).__name__, e.status, e.function, nvshmem.init_status()]))\n"
        "else:\n"
        "    raise SystemExit('initialised without a GPU')\n"
    )
    env = dict(os.environ, NVSHMEM_DISABLE_NVLS="1", NCCL_NVLS_ENABLE="0")
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{case} hung for 60 s without a GPU")
    assert proc.returncode == 0, proc.stderr[-2000:]
    name, status, function, init_status = json.loads(proc.stdout.splitlines()[-1])
    assert status != 0
    assert name == type(_status.make_error("nvshmem", function, status)).__name__
    assert function == "nvshmemid_hostlib_init_attr"
    # A failed init may leave the library bootstrapped (IS_BOOTSTRAPPED), never initialised.
    assert init_status in {nvshmem.InitStatus.NOT_INITIALIZED, nvshmem.InitStatus.IS_BOOTSTRAPPED}


# --- allocation before init -----------------------------------------------------------------


def test_malloc_before_init_raises_not_initialized() -> None:
    # The library itself would return NULL; the binding's init check says why first.
    with pytest.raises(NVSHMEMNotInitializedError, match="nvshmem_malloc needs an initialised NVSHMEM runtime"):
        nvshmem.malloc(1 << 20)


def test_a_null_return_raises_out_of_memory() -> None:
    # How a NULL return of an allocation reads (what malloc raises once initialised).
    err = _status.make_error("nvshmem", "nvshmem_malloc", int(nvshmem.Status.ERROR_OUT_OF_MEMORY))
    assert type(err) is NVSHMEMOutOfMemoryError
    assert isinstance(err, NVSHMEMError) and isinstance(err, LibraryError)
    assert err.function == "nvshmem_malloc"
    assert err.library == "nvshmem"
    assert "NVSHMEMX_ERROR_OUT_OF_MEMORY" in str(err)
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is NVSHMEMOutOfMemoryError and str(clone) == str(err)


# --- family dispatch -------------------------------------------------------------------------


def _dispatched(call: object) -> str:
    """The per-type function a dispatcher called; the first argument after dtype is object(),
    so that function's guard refuses it (TypeError) before any C call. The traceback's last frame
    of this module or of one of its private modules (_nvshmem_<family>.pyx, where the per-type
    functions are) is that function's (the guard's own frames are mpbind.bindings._common's)."""
    with pytest.raises(TypeError) as info:
        call()  # type: ignore[operator]
    tb: TracebackType | None = info.value.__traceback__
    last = None
    while tb is not None:
        if re.search(r"(^|/)_?nvshmem(_\w+)?\.pyx$", tb.tb_frame.f_code.co_filename):
            last = tb.tb_frame.f_code.co_name
        tb = tb.tb_next
    assert last is not None
    return last.rsplit(".", 1)[-1]


def test_unknown_type_name_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown element type"):
        nvshmem.put("quaternion", 0, 0, 0, 0)
    with pytest.raises(UsageError, match="no complex128 variant"):
        nvshmem.put(np.complex128, 0, 0, 0, 0)
    with pytest.raises(UsageError, match="no float32 variant"):
        nvshmem.and_reduce(np.float32, 0, 0, 0, 0)


def test_numpy_dtypes_map_to_members() -> None:
    assert _dispatched(lambda: nvshmem.put(np.float32, object(), 0, 0, 0)) == "float_put"
    assert _dispatched(lambda: nvshmem.put(np.dtype("float64"), object(), 0, 0, 0)) == "double_put"
    assert _dispatched(lambda: nvshmem.p("float16", object(), 0, 0)) == "half_p"
    assert _dispatched(lambda: nvshmem.sum_reduce_on_stream(np.int32, object(), 0, 0, 0, 0)) in {
        "int_sum_reduce_on_stream", "int32_sum_reduce_on_stream"}


def test_every_family_type_name_and_dtype_dispatches_to_its_width() -> None:
    problems = []
    families = [name[len("_FAMILY_"):] for name in vars(nvshmem) if name.startswith("_FAMILY_")]
    assert len(families) > 60
    for op in families:
        table: dict[str, object] = getattr(nvshmem, f"_FAMILY_{op}")
        dispatcher = getattr(nvshmem, op)
        nargs = len(inspect.signature(next(iter(table.values()))).parameters)
        for type_name, np_name in nvshmem.FAMILY_TYPES.items():
            for dtype in (type_name, np_name):
                if dtype == "bfloat16" and type_name not in table:
                    continue  # NumPy has no bfloat16
                try:
                    target = _dispatched(partial(dispatcher, dtype, object(), *([0] * (nargs - 1))))
                except UsageError:
                    if dtype == type_name and type_name in table:
                        problems.append(f"{op}({dtype!r}) raised UsageError")
                    continue
                except pytest.fail.Exception:
                    problems.append(f"{op}({dtype!r}) did not reach a per-type function")
                    continue
                chosen = target[: -len(op) - 1]
                if dtype == type_name and type_name in table and chosen != type_name:
                    problems.append(f"{op}({dtype!r}) -> {target}")
                elif nvshmem.FAMILY_TYPES.get(chosen) != np_name:
                    problems.append(f"{op}({dtype!r}) -> {target}, a {nvshmem.FAMILY_TYPES.get(chosen)} function "
                                    f"for a {np_name} type")
    assert problems == []


# --- errors ----------------------------------------------------------------------------------


def _error_members() -> list[nvshmem.Status]:
    return [m for m in nvshmem.Status if m.name not in NOT_ERRORS]


def test_one_error_class_per_status() -> None:
    classes = _status._CLASSES["nvshmem"]
    assert set(classes) == {int(m) for m in _error_members()}
    assert len(set(classes.values())) == len(classes)


@pytest.mark.parametrize("member", _error_members(), ids=lambda m: m.name)
def test_error_class_matches_status(member: nvshmem.Status) -> None:
    err = _status.make_error("nvshmem", "nvshmem_something", int(member))
    cls = type(err)
    assert cls is not NVSHMEMError and issubclass(cls, NVSHMEMError)
    assert cls.status_code == int(member)
    camel = "".join(part.capitalize() for part in member.name.removeprefix("ERROR_").split("_"))
    assert cls.__name__ == f"NVSHMEM{camel}Error"
    assert err.status_name == f"NVSHMEMX_{member.name}"
    assert err.status_name in str(err) and f"({int(member)})" in str(err)
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is cls and str(clone) == str(err) and clone.args == err.args


@pytest.mark.parametrize("status", [0, int(nvshmem.Status.ERROR_SENTINEL), 99, -4])
def test_non_error_and_unknown_statuses_are_plain(status: int) -> None:
    err = _status.make_error("nvshmem", "nvshmem_x", status)
    assert type(err) is NVSHMEMError
    assert err.status == status
