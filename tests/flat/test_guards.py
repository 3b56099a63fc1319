# mypy: disable-error-code="arg-type"
# (these tests pass wrongly typed arguments on purpose)
"""The flat bindings' guards: what each refuses before any C call, with which error and message, and
what still passes (ints, IntEnums, NumPy integers). Every refused call here would otherwise reach the
library with a value it crashes on or truncates (tests/fuzz has the sweep that found them)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from mpbind.bindings import cublasmp, cufftmp, nccl, nvshmem
from mpbind.errors import NCCLError, NVSHMEMNotInitializedError, UsageError

# --- pointers and handles ------------------------------------------------------------------------

HANDLE_CALLS: dict[str, Callable[[Any], object]] = {
    "nccl.comm_count(comm)": lambda v: nccl.comm_count(v),
    "nccl.all_reduce(..., comm, 0)": lambda v: nccl.all_reduce(0, 0, 0, 0, 0, v, 0),
    "nccl.all_reduce(sendbuff, ...)": lambda v: nccl.all_reduce(v, 0, 0, 0, 0, 0, 0),
    "nccl.param_get_i32(h)": lambda v: nccl.param_get_i32(v),
    "cufftmp.mp_get_reshape_size(handle)": lambda v: cufftmp.mp_get_reshape_size(v),
    "cufftmp.xt_free(descriptor)": lambda v: cufftmp.xt_free(v),
    "nvshmem.id_hostlib_finalize(device_ctx, 0)": lambda v: nvshmem.id_hostlib_finalize(v, 0),
    "nccl.Config.from_ptr(address)": lambda v: nccl.Config.from_ptr(v),
    "nvshmem.InitAttr.from_ptr(address)": lambda v: nvshmem.InitAttr.from_ptr(v),
}
NAMES = {"nccl.comm_count(comm)": "comm", "nccl.all_reduce(..., comm, 0)": "comm",
         "nccl.all_reduce(sendbuff, ...)": "sendbuff", "nccl.param_get_i32(h)": "h",
         "cufftmp.mp_get_reshape_size(handle)": "handle", "cufftmp.xt_free(descriptor)": "descriptor",
         "nvshmem.id_hostlib_finalize(device_ctx, 0)": "device_ctx",
         "nccl.Config.from_ptr(address)": "address", "nvshmem.InitAttr.from_ptr(address)": "address"}


@pytest.mark.parametrize("call", HANDLE_CALLS)
@pytest.mark.parametrize(("value", "error", "says"), [
    (-1, UsageError, ">= 0, got -1"),
    (-(2**70), UsageError, ">= 0"),
    (2**63, OverflowError, "below 2\\*\\*63"),
    (2**70, OverflowError, "below 2\\*\\*63"),
    (True, TypeError, "not bool"),
    (1.5, TypeError, "not float"),
    (None, TypeError, "not NoneType"),
    ("8", TypeError, "not str"),
], ids=["-1", "-2**70", "2**63", "2**70", "True", "1.5", "None", "str"])
def test_pointers_and_handles_refuse(call: str, value: object, error: type[Exception], says: str) -> None:
    with pytest.raises(error, match=rf"{NAMES[call]}.*{says}"):
        HANDLE_CALLS[call](value)


@pytest.mark.parametrize("call", [
    lambda: nccl.team_world(0), lambda: nccl.team_lsa(0), lambda: nccl.team_rail(0),
    lambda: nccl.team_cft(0, 0), lambda: nccl.team_cft_multimem(0), lambda: cufftmp.mp_destroy_reshape(0),
    lambda: nccl.Config.from_ptr(0),
], ids=["team_world", "team_lsa", "team_rail", "team_cft", "team_cft_multimem", "mp_destroy_reshape", "from_ptr"])
def test_null_is_refused_where_the_library_does_not_check(call: Callable[[], object]) -> None:
    with pytest.raises(UsageError, match="NULL"):
        call()


@pytest.mark.parametrize(("call", "says"), [
    (lambda: nccl.comm_init_all(0), "ndev must be >= 1, got 0"),
    (lambda: nccl.comm_init_all(0, []), "ndev must be >= 1, got 0"),
    (lambda: cublasmp.numroc(8, 0, 0, 0, 1), "nb must be >= 1, got 0"),
    (lambda: cublasmp.numroc(8, 2, 0, 0, 0), "nprocs must be >= 1, got 0"),
    (lambda: cublasmp.numroc(-1, 2, 0, 0, 1), "n must be >= 0, got -1"),
], ids=["comm_init_all", "comm_init_all_empty_list", "numroc_nb", "numroc_nprocs", "numroc_n"])
def test_values_the_library_divides_by_or_crashes_on_are_refused(call: Callable[[], object], says: str) -> None:
    # On a GPU these ended the process: SIGSEGV in ncclCommInitAll, SIGFPE in cublasMpNumroc.
    with pytest.raises(UsageError, match=says):
        call()


def test_null_still_reaches_the_libraries_that_check_it() -> None:
    # NCCL checks a NULL communicator itself: its own error, not a guard's.
    with pytest.raises(NCCLError):
        nccl.comm_count(0)


def test_int_like_pointers_pass() -> None:
    # A NumPy integer (an object with __index__) is an address; so is a nullable None.
    config = nccl.Config()
    config.blocking = 0
    for address in (config.ptr, np.int64(config.ptr), np.uint64(config.ptr)):
        assert nccl.Config.from_ptr(address).blocking == 0
    assert isinstance(nccl.get_last_error(None), str)
    assert isinstance(nccl.get_last_error(0), str)


def test_nullable_pointers_refuse_bad_values_too() -> None:
    with pytest.raises(UsageError, match="comm"):
        nccl.get_last_error(-1)
    with pytest.raises(TypeError, match="comm"):
        nccl.get_last_error(True)


def test_arrays_of_handles_and_ints_are_checked_per_element() -> None:
    with pytest.raises(TypeError, match="exclude_ranks_list"):
        nccl.comm_shrink(0, [1.5], None, 0)
    with pytest.raises(TypeError, match="exclude_ranks_list"):
        nccl.comm_shrink(0, [True], None, 0)


def test_mpi_comm_addresses_are_checked() -> None:
    with pytest.raises(UsageError, match="mpi_comm"):
        nvshmem.set_attr_mpi_comm_args(-1, nvshmem.InitAttr())
    with pytest.raises(TypeError, match="mpi_comm"):
        nvshmem.set_attr_mpi_comm_args(True, nvshmem.InitAttr())


# --- integers and enums --------------------------------------------------------------------------

INT_CALLS: dict[str, Callable[[Any], object]] = {
    "nccl.get_error_string(result)": lambda v: nccl.get_error_string(v),  # an enum
    "nccl.all_reduce(.., count, ..)": lambda v: nccl.all_reduce(0, 0, v, 0, 0, 0, 0),  # size_t
    "nccl.all_reduce(.., op, ..)": lambda v: nccl.all_reduce(0, 0, 0, 0, v, 0, 0),  # an enum
    "nvshmem.team_my_pe(team)": lambda v: nvshmem.team_my_pe(v),  # nvshmem_team_t, an alias of int32_t
    "cufftmp.set_stream(plan, 0)": lambda v: cufftmp.set_stream(v, 0),  # cufftHandle, an alias of int
    "nccl.Config().blocking = ": lambda v: setattr(nccl.Config(), "blocking", v),  # a struct's int field
    "nccl.Config(blocking=)": lambda v: nccl.Config(blocking=v),
}
INT_NAMES = {"nccl.get_error_string(result)": "result", "nccl.all_reduce(.., count, ..)": "count",
             "nccl.all_reduce(.., op, ..)": "op", "nvshmem.team_my_pe(team)": "team",
             "cufftmp.set_stream(plan, 0)": "plan", "nccl.Config().blocking = ": "blocking",
             "nccl.Config(blocking=)": "blocking"}


@pytest.mark.parametrize("call", INT_CALLS)
@pytest.mark.parametrize(("value", "says"), [
    (1.5, "not float"), (np.float64(1.0), "not float64"), (True, "not bool"), (np.bool_(True), "not bool"),
    (None, "not NoneType"), ("1", "not str"),
], ids=["1.5", "np.float64", "True", "np.bool_", "None", "str"])
def test_integers_refuse_floats_bools_and_others(call: str, value: object, says: str) -> None:
    with pytest.raises(TypeError, match=f"{INT_NAMES[call]} must be an int, {says}"):
        INT_CALLS[call](value)


def test_integers_still_take_ints_intenums_and_numpy_integers() -> None:
    for value in (0, nccl.Result.SUCCESS, np.int32(0), np.uint8(0), np.int64(0)):
        assert nccl.get_error_string(value) == nccl.get_error_string(0)
    config = nccl.Config()
    for blocking in (1, np.int16(0), np.int64(1)):
        config.blocking = blocking
        assert config.blocking == int(blocking) and type(config.blocking) is int
    with pytest.raises(OverflowError):
        nccl.get_error_string(2**40)


def test_floats_still_take_ints_and_floats() -> None:
    # double parameters are not integers: 2 and 2.5 are both values.
    with pytest.raises(NVSHMEMNotInitializedError):
        nvshmem.double_p(0, 2, 0)
    with pytest.raises(NVSHMEMNotInitializedError):
        nvshmem.double_p(0, 2.5, 0)


def test_handle_types_behave_like_newtype() -> None:
    assert nccl.Comm(5) == 5 and type(nccl.Comm(5)) is int
    assert nccl.Comm.__name__ == "Comm" and nccl.Comm.__module__ == "mpbind.bindings.nccl"
    assert nccl.Comm.__supertype__ is int
    assert repr(nccl.Comm) == "mpbind.bindings.nccl.Comm"
    assert pickle.loads(pickle.dumps(nccl.Comm)) is nccl.Comm
    union = nccl.Comm | None
    assert nccl.Comm in union.__args__  # type: ignore[attr-defined]


# --- element types of the family dispatchers ------------------------------------------------------

@pytest.mark.parametrize(("dispatcher", "nargs"), [("put", 4), ("atomic_add", 3), ("sum_reduce", 4), ("p", 3)])
def test_dispatchers_refuse_none_as_element_type(dispatcher: str, nargs: int) -> None:
    fn = getattr(nvshmem, dispatcher)
    with pytest.raises(TypeError, match=f"{dispatcher}: dtype must be .* not None"):
        fn(None, *[0] * nargs)


# --- NVSHMEM before init -------------------------------------------------------------------------

# One function of each family that ends the process or segfaults when called before init
# (tests/fuzz findings): RMA, on-stream RMA, collectives, synchronisation, atomics (which segfault),
# teams, memory, registration, modules, queue pairs, signals, finalisation, global exit.
BEFORE_INIT_REFUSED = {
    "nvshmem.int32_iput_on_stream(0, 0, 0, 0, 0, 0, 0)": "nvshmemx_int32_iput_on_stream",
    "nvshmem.putmem(0, 0, 0, 0)": "nvshmem_putmem",
    "nvshmem.put('float32', 0, 0, 0, 0)": "nvshmem_float_put",
    "nvshmem.getmem_nbi_on_stream(0, 0, 0, 0, 0)": "nvshmemx_getmem_nbi_on_stream",
    "nvshmem.barrier(0)": "nvshmem_barrier",
    "nvshmem.quiet()": "nvshmem_quiet",
    "nvshmem.fence()": "nvshmem_fence",
    "nvshmem.sum_reduce('int32', 0, 0, 0, 0)": "nvshmem_int32_sum_reduce",
    "nvshmem.double_atomic_add(0, 0, 0)": "nvshmemx_double_atomic_add",
    "nvshmem.int_atomic_compare_swap(0, 0, 0, 0)": "nvshmem_int_atomic_compare_swap",
    "nvshmem.team_my_pe(0)": "nvshmem_team_my_pe",
    "nvshmem.team_split_strided(0, 0, 1, 1, None, 0)": "nvshmem_team_split_strided",
    "nvshmem.free(0)": "nvshmem_free",
    "nvshmem.ptr(0, 0)": "nvshmem_ptr",
    "nvshmem.buffer_register(0, 0)": "nvshmemx_buffer_register",
    "nvshmem.buffer_unregister_all()": "nvshmemx_buffer_unregister_all",
    "nvshmem.cumodule_init(0)": "nvshmemx_cumodule_init",
    "nvshmem.culibrary_finalize(0)": "nvshmemx_culibrary_finalize",
    "nvshmem.signal_fetch(0)": "nvshmem_signal_fetch",
    "nvshmem.global_exit(0)": "nvshmem_global_exit",
    # The library takes these on a runtime that is only bootstrapped, and ends the process when it
    # cannot finish initialising it: they need an initialised runtime too.
    "nvshmem.barrier_all()": "nvshmem_barrier_all",
    "nvshmem.malloc(1 << 20)": "nvshmem_malloc",
    "nvshmem.hostlib_finalize()": "nvshmemx_hostlib_finalize",
    "nvshmem.finalize()": "nvshmemx_hostlib_finalize",
    "nvshmem.id_hostlib_finalize(0, 0)": "nvshmemid_hostlib_finalize",
}
BEFORE_INIT_ALLOWED = [
    "nvshmem.init_status()", "nvshmem.id_init_status()", "nvshmem.my_pe()", "nvshmem.n_pes()",
    "nvshmem.query_thread()", "nvshmem.info_get_version()", "nvshmem.info_get_name()",
    "nvshmem.vendor_get_version_info()", "nvshmem.get_uniqueid()",
    "nvshmem.set_attr_uniqueid_args(0, 1, nvshmem.get_uniqueid(), nvshmem.InitAttr())",
]


@pytest.fixture(scope="module")
def before_init() -> dict[str, list[str]]:
    """Each call's outcome in a fresh process that never initialises NVSHMEM (an unguarded call
    would end it): [exception class, message], or ["returned", repr]."""
    code = (
        "import json, sys\n"
        "from mpbind.bindings import nvshmem\n"
        "out = {}\n"
        "for call in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        out[call] = ['returned', repr(eval(call))]\n"
        "    except Exception as e:\n"
        "        out[call] = [type(e).__name__, str(e)]\n"
        "    sys.stdout.flush()\n"
        "print(json.dumps(out))\n"
    )
    calls = list(BEFORE_INIT_REFUSED) + BEFORE_INIT_ALLOWED
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(calls)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"the process ended (status {proc.returncode}): {proc.stderr[-2000:]}"
    return dict(json.loads(proc.stdout.splitlines()[-1]))


@pytest.mark.parametrize("call", BEFORE_INIT_REFUSED)
def test_nvshmem_before_init_raises_not_initialized(before_init: dict[str, list[str]], call: str) -> None:
    name, message = before_init[call]
    assert name == "NVSHMEMNotInitializedError", (name, message)
    assert message.startswith(BEFORE_INIT_REFUSED[call] + " needs an initialised NVSHMEM runtime")
    assert "NOT_INITIALIZED (0)" in message and "nvshmem.init()" in message


@pytest.mark.parametrize("call", BEFORE_INIT_ALLOWED)
def test_nvshmem_init_and_query_functions_work_before_init(before_init: dict[str, list[str]], call: str) -> None:
    assert before_init[call][0] == "returned", before_init[call]


def test_argument_errors_come_before_the_init_check() -> None:
    # A bad argument is reported as such, initialised or not.
    with pytest.raises(UsageError, match="dest") as info:
        nvshmem.putmem(-1, 0, 0, 0)
    assert not isinstance(info.value, NVSHMEMNotInitializedError)
    with pytest.raises(TypeError, match="pe must be an int"):
        nvshmem.putmem(0, 0, 0, 1.5)


def test_not_initialized_error_is_a_usage_error_and_pickles() -> None:
    with pytest.raises(NVSHMEMNotInitializedError) as info:
        nvshmem.quiet()
    err = info.value
    assert isinstance(err, UsageError) and isinstance(err, ValueError)
    assert err.function == "nvshmem_quiet"
    assert err.needed == nvshmem.InitStatus.IS_INITIALIZED and err.status == nvshmem.InitStatus.NOT_INITIALIZED
    clone = pickle.loads(pickle.dumps(err))
    assert type(clone) is NVSHMEMNotInitializedError and str(clone) == str(err)
