"""Every public constructor and call of the layer refuses a wrong argument before any library call,
with a TypeError (wrong kind) or UsageError (wrong value) that names it; internals are private."""

from __future__ import annotations

import pickle
import struct
import sys
from collections.abc import Callable
from typing import Any

import pytest

from mpbind import _core, cublasmp, cufftmp, nccl
from mpbind import nvshmem as nv
from mpbind.errors import MissingDependencyError, MpbindError, UsageError

UID = b"\0" * 128


def _refused(call: Callable[[], object], error: type[Exception], *names: str) -> str:
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    for name in names:
        assert name in message, message
    return message


# --- NCCL --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("nbytes", "error"), [(-1, UsageError), (0, UsageError), (2**70, UsageError),
                                               (True, TypeError), (1.5, TypeError), ("x", TypeError),
                                               (None, TypeError)])
def test_mem_alloc_names_nbytes(nbytes: Any, error: type[Exception]) -> None:
    _refused(lambda: nccl.mem_alloc(nbytes), error, "nbytes")


@pytest.mark.parametrize(("args", "error", "name"), [
    ((True, 0, UID), TypeError, "nranks"),
    ((2, False, UID), TypeError, "rank"),
    ((0, 0, UID), UsageError, "nranks"),
    ((2, 2, UID), UsageError, "rank"),
    ((2, -1, UID), UsageError, "rank"),
    ((2, 0, None), TypeError, "unique_id"),
    ((2, 0, UID, "blocking"), TypeError, "config"),
    ((1.0, 0, UID), TypeError, "nranks"),
])
def test_communicator_init_names_the_argument(args: tuple[Any, ...], error: type[Exception], name: str) -> None:
    _refused(lambda: nccl.Communicator.init(*args), error, name)


def test_communicator_constructors() -> None:
    _refused(lambda: nccl.Communicator(None), TypeError, "Communicator.init()")
    _refused(lambda: nccl.Communicator.from_mpi(None), TypeError, "comm", "mpi4py")


def test_missing_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "torch.distributed", None)
    with pytest.raises(ImportError) as info:  # an ImportError still, so `except ImportError` works
        nccl.Communicator.from_torch()
    err = info.value
    assert isinstance(err, MissingDependencyError) and isinstance(err, MpbindError)
    assert "pip install 'mpbind[torch]'" in str(err) and "Communicator.from_torch" in str(err)
    assert err.name == "torch" and err.extra == "torch"
    again = pickle.loads(pickle.dumps(err))
    assert type(again) is MissingDependencyError and str(again) == str(err)


def test_missing_mpi4py_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    _refused(lambda: cufftmp.Plan.create_3d(object(), (4, 4, 4), cufftmp.Type.C2C), TypeError, "mpbind[mpi]")


# --- cuBLASMp ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("stream", "error"), [(-1, UsageError), (2**70, UsageError), (True, TypeError),
                                               ("s", TypeError), (1.5, TypeError)])
def test_handle_names_the_stream(stream: Any, error: type[Exception]) -> None:
    _refused(lambda: cublasmp.Handle(stream), error, "stream")


def test_workspace_names_its_arguments() -> None:
    _refused(lambda: cublasmp.Workspace(None, 5), TypeError, "grid")  # type: ignore[arg-type]
    _refused(lambda: cublasmp.Workspace("grid", -1), TypeError, "grid")  # type: ignore[arg-type]


def test_matrix_and_matmul_refuse_none_before_any_call() -> None:
    _refused(lambda: cublasmp.Matrix(None, None), TypeError, "grid")  # type: ignore[arg-type]
    for call in (lambda: cublasmp.Matmul(None, None, None, None),  # type: ignore[arg-type]
                 lambda: cublasmp.matmul(None, None, None, None),  # type: ignore[arg-type]
                 lambda: cublasmp.gemm(None, None, None, None)):  # type: ignore[arg-type]
        _refused(call, TypeError, "handle", "cublasmp.Handle")
    _refused(lambda: cublasmp.grid(None, 1, 1), TypeError, "comm")  # type: ignore[arg-type]


def test_matmul_operands_are_named() -> None:
    handle = cublasmp.Handle.__new__(cublasmp.Handle)  # an unusable handle: only its type is checked first
    _refused(lambda: cublasmp.Matmul(handle, None, None, None), TypeError, "a must be")  # type: ignore[arg-type]
    matrix = object.__new__(cublasmp.Matrix)
    _refused(lambda: cublasmp.Matmul(handle, matrix, None, matrix), TypeError, "b must be")  # type: ignore[arg-type]
    _refused(lambda: cublasmp.Matmul(handle, matrix, matrix, matrix, 5), TypeError, "c must be")  # type: ignore[arg-type]
    _refused(lambda: cublasmp.Matmul(handle, matrix, matrix, matrix, transa=1), TypeError,  # type: ignore[arg-type]
             "transa")
    _refused(lambda: cublasmp.gemm(handle, matrix, matrix, matrix, alpha="2"), TypeError,  # type: ignore[arg-type]
             "alpha")


def test_a_matmul_over_a_core_plan_takes_only_a_core_plan() -> None:
    descriptor = object.__new__(cublasmp.MatmulDescriptor)
    _refused(lambda: cublasmp.Matmul.from_core(object(), 1, 1, 1, descriptor, processes=1), TypeError,
             "plan must be", "MatmulPlan")


def test_the_matrix_types_are_read_only_and_scalars_are_packed_for_their_compute_type() -> None:
    assert cublasmp.DATA_TYPES["float32"] == cublasmp.CudaDataType.R_32F
    with pytest.raises(TypeError):
        cublasmp.DATA_TYPES["float32"] = cublasmp.CudaDataType.R_64F  # type: ignore[index]
    assert cublasmp.scalar_bytes(1.5, cublasmp.CublasComputeType.COMPUTE_64F) == struct.pack("=d", 1.5)
    assert cublasmp.scalar_bytes(2.0, cublasmp.CublasComputeType.COMPUTE_32F, True) == struct.pack("=ff", 2.0, 0.0)


def test_matmul_descriptor_attributes_are_checked_before_the_library() -> None:
    d = object.__new__(cublasmp.MatmulDescriptor)  # no core: a checked value would reach it
    _refused(lambda: setattr(d, "transa", "T"), TypeError, "transa")
    _refused(lambda: setattr(d, "transa", 7), UsageError, "transa", "CublasOperation")
    _refused(lambda: setattr(d, "communication_sm_count", 2**40), UsageError, "communication_sm_count")
    _refused(lambda: setattr(d, "bias_pointer", -1), UsageError, "bias_pointer")
    _refused(lambda: setattr(d, "epilogue", None), TypeError, "epilogue")
    _refused(lambda: cublasmp.MatmulDescriptor("fast"), TypeError, "compute_type")  # type: ignore[arg-type]
    _refused(lambda: cublasmp.MatmulDescriptor(99999), UsageError, "compute_type")
    _refused(lambda: cublasmp.MatmulDescriptor(transz=1), TypeError, "transz")


def test_matmul_descriptor_properties_follow_the_attribute_table() -> None:
    from mpbind.bindings import cublasmp as flat

    declared = {name: value for name, value in vars(cublasmp.MatmulDescriptor).items()
                if isinstance(value, cublasmp._Attribute)}
    assert set(declared) == {a.name.lower() for a in flat.MatmulDescriptorAttribute}
    for name, prop in declared.items():
        attr = flat.MatmulDescriptorAttribute[name.upper()]
        assert prop.attr is attr
        assert prop.kind is (flat.MATMUL_DESCRIPTOR_ATTRIBUTE_TYPES[attr][2] or int), name


# --- NVSHMEM -----------------------------------------------------------------------------------


def test_nvshmem_internals_are_private() -> None:
    assert not hasattr(nv.Runtime, "start")
    _refused(lambda: nv.SymmetricArray(0, (4,), "float32", 0), TypeError, "empty()")  # type: ignore[call-arg]
    _refused(lambda: nv.PeerArray(None, 0, 0), TypeError, "peer()")  # type: ignore[call-arg]


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"rank": True, "nranks": 2}, TypeError, "rank"),
    ({"rank": 0, "nranks": 0}, UsageError, "nranks"),
    ({"rank": 2, "nranks": 2}, UsageError, "rank"),
    ({"rank": 0}, UsageError, "nranks"),
    ({"rank": 0, "nranks": 2, "device": -1}, UsageError, "device"),
    ({"rank": 0, "nranks": 2, "device": "cuda:0"}, TypeError, "device"),
    ({"rank": 0, "nranks": 2, "notice_after": 0}, UsageError, "notice_after"),
    ({"rank": 0, "nranks": 2, "placement_via": 5}, TypeError, "via"),
])
def test_nvshmem_init_names_the_argument(kwargs: dict[str, Any], error: type[Exception], name: str) -> None:
    _refused(lambda: nv.init(UID, **kwargs), error, name)
    assert not nv.is_initialized()


def test_nvshmem_init_refuses_a_non_communicator() -> None:
    _refused(lambda: nv.init(mpi_comm=object()), TypeError, "mpi_comm")


# --- cuFFTMp -----------------------------------------------------------------------------------


def test_cufftmp_names_the_argument() -> None:
    _refused(lambda: cufftmp.Plan.create_decomposition(None, None, cufftmp.Type.C2C,  # type: ignore[arg-type]
                                                       ((0,), (1,)), ((0,), (1,))), TypeError, "shape")
    # Objects without their library handle (cuFFTMp needs a GPU to make one): the checks come first.
    reshape = cufftmp.Reshape.__new__(cufftmp.Reshape)
    _refused(lambda: reshape.make(None, "float32", None, None), TypeError, "input_box")  # type: ignore[arg-type]
    _refused(lambda: reshape.make(None, "float32", ((0, 0, "x"), (1, 1, 1)),  # type: ignore[arg-type]
                                  ((0, 0, 0), (1, 1, 1))), TypeError, "input_box lower corner[2]")
    plan = cufftmp.Plan.__new__(cufftmp.Plan)
    _refused(lambda: plan.set_subformat_default("x", 1), TypeError, "forward")  # type: ignore[arg-type]
    _refused(lambda: plan.set_subformat_default(0, 99), UsageError, "inverse")
    _refused(lambda: plan.set_distribution([0, 0], None, [0, 0], [1, 1]), TypeError,  # type: ignore[arg-type]
             "upper_input")


# --- the core ----------------------------------------------------------------------------------


def test_alive_lists_unreleased_objects() -> None:
    before = {serial for _, serial in _core.alive()}
    owner = _core._testing.Owner(collective=False, on_deregister=None)
    res = owner.add(False, None)
    new = [(kind, serial) for kind, serial in _core.alive() if serial not in before]
    assert new == [("testing.Owner", owner.serial), ("testing.Resource", res.serial)]
    res.close()
    assert res.serial not in {serial for _, serial in _core.alive()}
    owner.close()
