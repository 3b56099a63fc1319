# mypy: disable-error-code="arg-type"
# (these tests pass wrongly typed arguments on purpose)
"""NVSHMEM's collective launch without a GPU: how its arguments are converted and refused (before
anything else), and that a call before initialisation raises NVSHMEMNotInitializedError.

A launch of a real kernel needs a GPU: tests/gpu/test_nvshmem_launch_gpu.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from mpbind.bindings import nvshmem
from mpbind.errors import NVSHMEMNotInitializedError, UsageError

# The conversions (module-private, in src/mpbind/bindings/_support/nvshmem.pxi; not in the stubs).
kernel_address: Any = nvshmem._kernel_address  # type: ignore[attr-defined]
extents: Any = nvshmem._extents  # type: ignore[attr-defined]
argument_addresses: Any = nvshmem._argument_addresses  # type: ignore[attr-defined]

KERNEL = 0x7F00_1234_5000  # any non-NULL address: no call below reaches the library


@dataclass
class KernelObject:
    """What cuda.core's Kernel looks like to the conversion: a `handle`."""

    handle: Any


# -- kernels -----------------------------------------------------------------------------------

def test_kernel_as_int_and_numpy_integer() -> None:
    assert kernel_address(KERNEL) == KERNEL
    assert kernel_address(np.uint64(KERNEL)) == KERNEL
    assert kernel_address(2**64 - 1) == 2**64 - 1


def test_kernel_as_cuda_bindings_handles() -> None:
    driver = pytest.importorskip("cuda.bindings.driver")
    runtime = pytest.importorskip("cuda.bindings.runtime")
    assert kernel_address(driver.CUkernel(KERNEL)) == KERNEL
    assert kernel_address(driver.CUfunction(KERNEL)) == KERNEL
    assert kernel_address(runtime.cudaKernel_t(KERNEL)) == KERNEL


def test_kernel_as_an_object_with_a_handle() -> None:
    driver = pytest.importorskip("cuda.bindings.driver")
    assert kernel_address(KernelObject(driver.CUkernel(KERNEL))) == KERNEL
    assert kernel_address(KernelObject(KERNEL)) == KERNEL


@pytest.mark.parametrize("kernel", [1.5, "kernel", None, True, object(), KernelObject("x")],
                         ids=["float", "str", "None", "bool", "object", "bad-handle"])
def test_kernel_of_a_wrong_type_is_a_type_error(kernel: object) -> None:
    with pytest.raises(TypeError, match="func must be a kernel"):
        kernel_address(kernel)
    with pytest.raises(TypeError, match="func must be a kernel"):
        nvshmem.collective_launch(kernel, 1, 1, None, 0, 0)


@pytest.mark.parametrize("kernel", [0, -1, 2**64], ids=["NULL", "negative", "too-large"])
def test_kernel_of_a_wrong_value_is_a_usage_error(kernel: int) -> None:
    with pytest.raises(UsageError, match="func must be a non-NULL address"):
        kernel_address(kernel)
    with pytest.raises(UsageError, match="func must be a non-NULL address"):
        nvshmem.collective_launch_query_gridsize(kernel, 128, None, 0)


def test_a_null_cuda_bindings_kernel_is_a_usage_error() -> None:
    driver = pytest.importorskip("cuda.bindings.driver")
    with pytest.raises(UsageError):
        kernel_address(driver.CUkernel())


# -- dim3 ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "expected"), [
    (7, (7, 1, 1)),
    (np.int32(7), (7, 1, 1)),
    ((7,), (7, 1, 1)),
    ((7, 2), (7, 2, 1)),
    ((7, 2, 3), (7, 2, 3)),
    ([7, 2, 3], (7, 2, 3)),
    ((np.uint32(4), 2**32 - 1, 0), (4, 2**32 - 1, 0)),
    (0, (0, 1, 1)),  # a grid of 0: NVSHMEM picks the largest grid that fits
])
def test_extents(value: object, expected: tuple[int, int, int]) -> None:
    assert extents(value) == expected


def test_extents_of_an_object_with_x_y_z() -> None:
    assert extents(nvshmem.Dim3(x=4, y=5, z=6)) == (4, 5, 6)
    runtime = pytest.importorskip("cuda.bindings.runtime")
    dim = runtime.dim3()
    dim.x, dim.y, dim.z = 8, 2, 1
    assert extents(dim) == (8, 2, 1)


@pytest.mark.parametrize("value", [1.0, "8", None, True, (1, 2.0), (1, True), {"x": 1}, b"\x01"],
                         ids=["float", "str", "None", "bool", "float-extent", "bool-extent", "dict", "bytes"])
def test_dims_of_a_wrong_type_are_a_type_error(value: object) -> None:
    with pytest.raises(TypeError, match="grid_dims must be an int or a tuple"):
        nvshmem.collective_launch(KERNEL, value, 1, None, 0, 0)
    with pytest.raises(TypeError, match="block_dims must be an int or a tuple"):
        nvshmem.collective_launch_query_gridsize(KERNEL, value, None, 0)


@pytest.mark.parametrize("value", [(), (1, 2, 3, 4), -1, (1, -2), 2**32, (1, 1, 2**32)],
                         ids=["empty", "four", "negative", "negative-y", "too-large", "too-large-z"])
def test_dims_of_a_wrong_value_are_a_usage_error(value: object) -> None:
    with pytest.raises(UsageError, match="block_dims"):
        nvshmem.collective_launch(KERNEL, 1, value, None, 0, 0)


# -- kernel arguments ----------------------------------------------------------------------------

def test_argument_addresses() -> None:
    assert argument_addresses(None) is None
    assert argument_addresses([]) == []
    assert argument_addresses((0x1000, np.uint64(0x2000))) == [0x1000, 0x2000]
    assert argument_addresses(0x3000) == 0x3000  # a ready kernelParams array


@pytest.mark.parametrize("args", ["abc", 1.5, True, object()], ids=["str", "float", "bool", "object"])
def test_arguments_of_a_wrong_type_are_a_type_error(args: object) -> None:
    with pytest.raises(TypeError, match="args must be a tuple or list"):
        nvshmem.collective_launch(KERNEL, 1, 1, args, 0, 0)


@pytest.mark.parametrize(("args", "message"), [
    ([0x1000, 1.5], r"args\[1\] must be an int address"),
    ([None], r"args\[0\] must be an int address"),
])
def test_an_argument_of_a_wrong_type_is_a_type_error(args: object, message: str) -> None:
    with pytest.raises(TypeError, match=message):
        nvshmem.collective_launch_attr(nvshmem.CollectiveLaunchAttr(), KERNEL, args)


@pytest.mark.parametrize("args", [[0x1000, 0], [-8], 0, 2**64], ids=["NULL-arg", "negative", "NULL", "too-large"])
def test_arguments_of_a_wrong_value_are_a_usage_error(args: object) -> None:
    with pytest.raises(UsageError, match="args"):
        nvshmem.collective_launch(KERNEL, 1, 1, args, 0, 0)


# -- the other parameters ------------------------------------------------------------------------

def test_attr_must_be_a_collective_launch_attr() -> None:
    with pytest.raises(TypeError):
        nvshmem.collective_launch_attr(nvshmem.InitAttr(), KERNEL)


def test_launch_attributes_hold_a_cuda_launch_config() -> None:
    config = nvshmem.LaunchConfig(gridDim=nvshmem.Dim3(x=4, y=1, z=1), blockDim=nvshmem.Dim3(x=128, y=1, z=1),
                                  dynamicSmemBytes=256, stream=0)
    attr = nvshmem.CollectiveLaunchAttr(cuda_config=config)
    assert attr.nbytes == config.nbytes == 56  # cudaLaunchConfig_t on a 64-bit host
    got = attr.cuda_config
    assert (got.gridDim.x, got.blockDim.x, got.dynamicSmemBytes, got.numAttrs) == (4, 128, 256, 0)


def test_shared_mem_is_a_size() -> None:
    with pytest.raises((OverflowError, UsageError)):
        nvshmem.collective_launch(KERNEL, 1, 1, None, -1, 0)


# -- the call before initialisation ---------------------------------------------------------------

CALLS: dict[str, Callable[[], object]] = {
    "nvshmemx_collective_launch": lambda: nvshmem.collective_launch(KERNEL, (2, 1, 1), 64, [KERNEL], 0, 0),
    "nvshmemx_collective_launch_attr": lambda: nvshmem.collective_launch_attr(nvshmem.CollectiveLaunchAttr(), KERNEL),
    "nvshmemx_collective_launch_query_gridsize": lambda: nvshmem.collective_launch_query_gridsize(KERNEL, 64, None, 0),
}


@pytest.mark.parametrize("function", sorted(CALLS))
def test_call_before_init_raises_not_initialized(function: str) -> None:
    """A launch needs an initialised runtime: before init, once its arguments passed their checks,
    each function raises NVSHMEMNotInitializedError and the library is not called."""
    with pytest.raises(NVSHMEMNotInitializedError) as info:
        CALLS[function]()
    assert info.value.function == function
    assert nvshmem.init_status() == nvshmem.InitStatus.NOT_INITIALIZED
