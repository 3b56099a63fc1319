"""mpbind.nvshmem without a GPU: argument checks and lifecycle errors, all before any C call.

NVSHMEM is never initialised in this process. Lifecycle checks that need a runtime run in
child processes, where ``mpbind._core.nvshmem.start`` adopts a no-op initialisation (so the bookkeeping
runs against the real libnvshmem_host, whose getters and finalize are harmless before init),
or where a real initialisation fails because no GPU is visible.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest

from mpbind import _core
from mpbind import nvshmem as nv
from mpbind._infra.info import gpu_count
from mpbind.errors import UsageError

CHILD_TIMEOUT_S = 60
ENV = dict(os.environ, NVSHMEM_DISABLE_NVLS="1", NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1")


class _FakeArray:
    """A CUDA array as the interop layer sees it (never dereferenced)."""

    def __init__(self, ptr: int = 0x10000, n: int = 4, typestr: str = "<f4") -> None:
        self.__cuda_array_interface__ = {"version": 3, "shape": (n,), "typestr": typestr, "data": (ptr, False),
                                         "strides": None}


def _child(code: str) -> Any:
    """Run `code` in a fresh interpreter; it prints one JSON line last, which is returned."""
    prelude = ("import json, warnings\nfrom mpbind import nvshmem as nv, _core\n"
               "from mpbind.errors import UsageError, NVSHMEMError, MpbindError\n")
    try:
        proc = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True,
                              timeout=CHILD_TIMEOUT_S, env=ENV)
    except subprocess.TimeoutExpired:
        pytest.fail(f"child hung for {CHILD_TIMEOUT_S} s")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- before init -----------------------------------------------------------------------------

BEFORE_INIT: dict[str, Callable[[], object]] = {
    "runtime": nv.runtime,
    "finalize": nv.finalize,
    "my_pe": nv.my_pe,
    "n_pes": nv.n_pes,
    "device": nv.device,
    "empty": lambda: nv.empty(4, "float32"),
    "zeros": lambda: nv.zeros((2, 2), "int32"),
    "register": lambda: nv.register((0x1000, 64)),
    "put": lambda: nv.put(_FakeArray(), _FakeArray(), 0),
    "put_none": lambda: nv.put(None, None, 0),
    "get": lambda: nv.get(_FakeArray(), _FakeArray(), 0),
    "quiet": nv.quiet,
    "barrier_all": nv.barrier_all,
    "sync_all": nv.sync_all,
    "barrier": nv.barrier,
    "broadcast": lambda: nv.broadcast(_FakeArray(), _FakeArray(), 0),
    "fcollect": lambda: nv.fcollect(_FakeArray(), _FakeArray()),
    "alltoall": lambda: nv.alltoall(_FakeArray(), _FakeArray()),
    "reduce": lambda: nv.reduce("sum", _FakeArray(), _FakeArray()),
    "core_allocate": lambda: _core.nvshmem.allocate(64),
    "core_containing": lambda: _core.nvshmem.containing(0x1000, 4),
}


@pytest.mark.parametrize("name", sorted(BEFORE_INIT))
def test_use_before_init_is_a_usage_error(name: str) -> None:
    assert not nv.is_initialized()
    with pytest.raises(UsageError, match="not initialised: call mpbind.nvshmem.init"):
        BEFORE_INIT[name]()


def test_state_before_init() -> None:
    assert nv.is_initialized() is False
    assert nv.is_finalized() is False
    assert _core.queued() == []


def test_no_gpu_is_shared_before_init() -> None:
    # asked of the library itself (nvshmemx_init_status): the count the kernel grids and the
    # collective matmul refuse on needs a runtime, and is 1 without one
    assert nv.pes_sharing_this_gpu() == 1


# --- argument checks -------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [0, (4, 0), (), -1, (2, -3), (2.0,), (True,), "4"])
def test_bad_or_empty_shapes_are_rejected(shape: Any) -> None:
    if shape == ():  # a 0-d array has one element: it passes the shape check, and needs a runtime
        with pytest.raises(UsageError, match="not initialised"):
            nv.empty(shape)
        return
    with pytest.raises(UsageError, match="shape|empty symmetric array"):
        nv.empty(shape)


@pytest.mark.parametrize("dtype", ["complex256", "float128", "object", "quaternion", 3])
def test_bad_dtypes_are_rejected(dtype: Any) -> None:
    with pytest.raises(UsageError, match="unsupported dtype"):
        nv.zeros(4, dtype)


@pytest.mark.parametrize("alignment", [3, 100, -8, 1.5])
def test_bad_alignment_is_rejected(alignment: Any) -> None:
    with pytest.raises(UsageError, match="alignment"):
        nv.empty(4, "float32", alignment=alignment)


INIT_ERRORS: dict[str, tuple[dict[str, Any], type[Exception], str]] = {
    "nothing": ({}, UsageError, "needs unique_id"),
    "nranks_zero": ({"unique_id": b"\0" * 128, "rank": 0, "nranks": 0}, UsageError, "nranks"),
    "nranks_missing": ({"unique_id": b"\0" * 128, "rank": 0}, UsageError, "nranks"),
    "rank_too_big": ({"unique_id": b"\0" * 128, "rank": 2, "nranks": 2}, UsageError, "rank"),
    "rank_negative": ({"unique_id": b"\0" * 128, "rank": -1, "nranks": 2}, UsageError, "rank"),
    "device_negative": ({"unique_id": b"\0" * 128, "rank": 0, "nranks": 1, "device": -1}, UsageError, "device"),
    "bad_bootstrap": ({"unique_id": b"\0" * 128, "rank": 0, "nranks": 1, "bootstrap": "pmi"}, UsageError,
                      "bootstrap"),
    "uid_with_mpi_bootstrap": ({"unique_id": b"\0" * 128, "rank": 0, "nranks": 1, "bootstrap": "mpi"}, UsageError,
                               "uid"),
    "comm_and_uid": ({"unique_id": b"\0" * 128, "mpi_comm": object()}, UsageError, "not both"),
    # Arguments of the wrong kind (not of a wrong value) are TypeErrors, named like the others.
    "rank_bool": ({"unique_id": b"\0" * 128, "rank": True, "nranks": 2}, TypeError, "rank"),
    "device_str": ({"unique_id": b"\0" * 128, "rank": 0, "nranks": 1, "device": "cuda:0"}, TypeError, "device"),
    "not_a_comm": ({"mpi_comm": object()}, TypeError, "mpi4py communicator"),
}


@pytest.mark.parametrize("case", sorted(INIT_ERRORS))
def test_init_argument_errors(case: str) -> None:
    kwargs, error, match = INIT_ERRORS[case]
    with pytest.raises(error, match=match):
        nv.init(**kwargs)
    assert not nv.is_initialized() and not nv.is_finalized()


def test_unknown_reduce_op() -> None:
    with pytest.raises(UsageError, match="unknown op 'mean'"):
        nv.reduce("mean", _FakeArray(), _FakeArray())


def test_public_api() -> None:
    for name in nv.__all__:
        assert hasattr(nv, name), name
    assert nv.Runtime is _core.nvshmem.Runtime and nv.Registration is _core.Registration
    assert nv.__doc__


HOT = ("put", "get", "quiet", "barrier_all", "sync_all", "barrier", "broadcast", "fcollect", "alltoall", "reduce")


@pytest.mark.parametrize("name", HOT)
def test_hot_calls_are_the_cores_functions(name: str) -> None:
    # No Python frame around them: each call goes straight into the core, which documents them.
    assert getattr(nv, name) is getattr(_core.nvshmem, name)
    assert "nvshmemx_" in (getattr(nv, name).__doc__ or "")


# --- lifecycle in child processes ------------------------------------------------------------

# A runtime over a no-op initialisation: the bookkeeping is real, the library is not initialised.
ADOPT = ("P = {'bootstrap': 'uid', 'rank': '0', 'nranks': '1', 'device': 'current'}\n"
         "rt = _core.nvshmem.start(P, lambda: None, require_initialized=False)\n")


def test_second_init_with_other_parameters_names_them() -> None:
    out = _child(ADOPT + (
        "msgs = []\n"
        "for kw in ({'rank': 0, 'nranks': 2}, {'rank': 0, 'nranks': 1, 'device': 3}):\n"
        "    try: nv.init(b'\\0' * 128, **kw)\n"
        "    except UsageError as e: msgs.append(str(e))\n"
        "same = nv.init(nv._flat().get_uniqueid(), 0, 1)\n"
        "print(json.dumps([msgs, same.serial == rt.serial, nv.runtime().serial == rt.serial,\n"
        "                  dict(rt.params), nv.is_initialized()]))\n"))
    msgs, same, current, params, initialised = out
    assert len(msgs) == 2
    assert "nranks=2 (the live runtime has 1)" in msgs[0]
    assert "device=3 (the live runtime has current)" in msgs[1]
    assert same and current and initialised
    assert params == {"bootstrap": "uid", "rank": "0", "nranks": "1", "device": "current"}


def test_hot_calls_check_their_arguments_against_the_live_runtime_then_refuse_after_finalize() -> None:
    out = _child(ADOPT + (
        "class A:\n"
        "    __cuda_array_interface__ = {'version': 3, 'shape': (4,), 'typestr': '<f4', 'data': (0x10000, False),\n"
        "                                'strides': None}\n"
        "a = A()\n"
        "calls = [lambda: nv.put(a, a, 0, 7), lambda: nv.get(a, a, 0), lambda: nv.put(nv, a, 0),\n"
        "         lambda: nv.broadcast(a, a, 0), lambda: nv.quiet(stream=1.5)]\n"
        "def run():\n"
        "    out = []\n"
        "    for f in calls:\n"
        "        try: f(); out.append(None)\n"
        "        except (UsageError, TypeError) as e: out.append([type(e).__name__, str(e)])\n"
        "    return out\n"
        "live = run()\n"
        "rt.finalize()\n"
        "print(json.dumps([live, run()]))\n"))
    live, after = out
    assert [e[0] for e in live] == ["UsageError", "UsageError", "TypeError", "UsageError", "TypeError"], live
    assert "dest is not NVSHMEM symmetric memory" in live[0][1]
    assert "src is not NVSHMEM symmetric memory" in live[1][1]
    assert live[2][1].startswith("dest: expected an array")
    assert "dest is not NVSHMEM symmetric memory" in live[3][1]
    assert live[4][1].startswith("stream must be")
    assert all("cannot be used or initialised again" in e[1] for e in after), after


def test_finalize_is_final() -> None:
    out = _child(ADOPT + (
        "world = rt.team_world\n"
        "rt.finalize(); rt.finalize()  # idempotent\n"
        "errors = []\n"
        "for f in (lambda: nv.init(b'\\0' * 128, 0, 1), lambda: nv.empty(4), lambda: rt.my_pe,\n"
        "          lambda: nv.quiet(), lambda: nv.runtime(), lambda: world.handle):\n"
        "    try: f(); errors.append(None)\n"
        "    except UsageError as e: errors.append(str(e))\n"
        "print(json.dumps([errors, rt.finalized, world.closed, nv.is_finalized(), nv.is_initialized()]))\n"))
    errors, finalized, world_closed, is_finalized, is_initialized = out
    assert all(e is not None for e in errors), errors
    assert all("cannot be used or initialised again" in e for e in errors[:5]), errors
    assert "closed" in errors[5]
    assert finalized and world_closed and is_finalized and not is_initialized


def test_runtime_context_manager_finalizes() -> None:
    out = _child(ADOPT + (
        "with rt as r: inside = r.finalized\n"
        "print(json.dumps([inside, rt.finalized, nv.is_finalized()]))\n"))
    assert out == [False, True, True]


def test_predefined_teams_close_without_destroying() -> None:
    out = _child(ADOPT + (
        "w, s, n = rt.team_world, rt.team_shared, rt.team_node\n"
        "w.close(); w.destroy()\n"
        "again = rt.team_world\n"
        "print(json.dumps([[t.handle for t in (again, s, n)], w.closed, again.closed, w.predefined]))\n"))
    assert out == [[0, 1, 2], True, False, True]


def test_team_split_arguments_checked() -> None:
    out = _child(ADOPT + (
        "w = rt.team_world\n"
        "n = w.n_pes\n"
        "msgs = []\n"
        "for args in ((0, 1, 0), (0, 0, 1), (-1, 1, 1), (0, 1, n + 1), (2**40, 1, 1)):\n"
        "    try: w.split_strided(*args); msgs.append(None)\n"
        "    except UsageError as e: msgs.append(str(e))\n"
        "for f in (lambda: w.split_strided(True, 1, 1), lambda: w.split_strided(0, 1.0, 1),\n"
        "          lambda: w.translate_pe(0, None), lambda: w.translate_pe('0', w)):\n"
        "    try: f(); msgs.append(None)\n"
        "    except TypeError as e: msgs.append(str(e))\n"
        "print(json.dumps(msgs))\n"))
    assert all(m is not None for m in out), out
    assert [m.split(" ")[0] for m in out[5:]] == ["start", "stride", "dest_team", "pe"], out


def test_a_failing_init_callback_leaves_no_runtime() -> None:
    out = _child(
        "def boom(): raise RuntimeError('bootstrap failed')\n"
        "try: _core.nvshmem.start({'bootstrap': 'uid'}, boom)\n"
        "except RuntimeError as e: msg = str(e)\n"
        "print(json.dumps([msg, nv.is_initialized(), nv.is_finalized()]))\n")
    assert out == ["bootstrap failed", False, False]


def test_allocation_failure_is_a_typed_error_and_tracks_nothing() -> None:
    # Without initialisation nvshmem_malloc returns NULL: the core turns it into the library's error.
    out = _child(ADOPT + (
        "from mpbind.errors import NVSHMEMOutOfMemoryError\n"
        "try: nv.empty((4, 4), 'float64')\n"
        "except NVSHMEMOutOfMemoryError as e: err = [type(e).__name__, e.function, e.status]\n"
        "try: nv.zeros(8, 'int32')\n"
        "except NVSHMEMOutOfMemoryError as e: err2 = e.function\n"
        "try: nv.empty(8, 'int32', alignment=4096)\n"
        "except NVSHMEMOutOfMemoryError as e: err3 = e.function\n"
        "print(json.dumps([err, err2, err3, rt.allocations(), _core.queued()]))\n"))
    err, err2, err3, allocations, queued = out
    assert err == ["NVSHMEMOutOfMemoryError", "nvshmem_malloc", 2]
    assert err2 == "nvshmem_calloc" and err3 == "nvshmem_align"
    assert allocations == [] and queued == []


def test_non_symmetric_arrays_are_rejected_before_any_call() -> None:
    out = _child(ADOPT + (
        "class A:\n"
        "    def __init__(s, n=4, t='<f4'): s.__cuda_array_interface__ = {'version': 3, 'shape': (n,),\n"
        "        'typestr': t, 'data': (0x10000, False), 'strides': None}\n"
        "    device = 0\n"
        "msgs = []\n"
        "for f in (lambda: nv.put(A(), A(), 0), lambda: nv.get(A(), A(), 0), lambda: nv.reduce('sum', A(), A()),\n"
        "          lambda: nv.broadcast(A(), A(), 0), lambda: nv.put(A(), A(), 5)):\n"
        "    try: f(); msgs.append(None)\n"
        "    except UsageError as e: msgs.append(str(e))\n"
        "print(json.dumps(msgs))\n"))
    assert all(m is not None and "not NVSHMEM symmetric memory" in m for m in out[:4]), out
    assert out[4] is not None


def test_registration_arguments_checked() -> None:
    out = _child(ADOPT + (
        "msgs = []\n"
        "for ptr, size in ((0, 64), (0x1000, 0)):\n"
        "    try: rt.register(ptr, size); msgs.append(None)\n"
        "    except UsageError as e: msgs.append(str(e))\n"
        "print(json.dumps(msgs))\n"))
    assert out == ["cannot register a NULL pointer", "cannot register 0 bytes"]


@pytest.mark.parametrize("bootstrap", ["uid", "uid_device"])
def test_real_init_without_gpu_raises_a_typed_error(bootstrap: str) -> None:
    count, _ = gpu_count()
    if count > 0:
        pytest.skip("a GPU is visible: initialisation would succeed")
    device = ", device=0" if bootstrap == "uid_device" else ""
    out = _child(
        "try:\n"
        f"    nv.init(nv._flat().get_uniqueid(), 0, 1{device})\n"
        "except MpbindError as e:\n"
        "    err = [type(e).__name__, isinstance(e, NVSHMEMError), getattr(e, 'function', None)]\n"
        "else:\n"
        "    raise SystemExit('initialised without a GPU')\n"
        "try: nv.empty(4)\n"
        "except UsageError as e: after = str(e)\n"
        "print(json.dumps([err, nv.is_initialized(), nv.is_finalized(), after]))\n")
    err, initialised, finalized, after = out
    if bootstrap == "uid":
        assert err[1] is True and err[2] == "nvshmemid_hostlib_init_attr", err
    else:  # cudaSetDevice fails first: a CudaError naming it
        assert (err[0], err[2]) == ("CudaError", "cudaSetDevice(0)") or err[1], err
    assert not initialised and not finalized
    assert "not initialised" in after
