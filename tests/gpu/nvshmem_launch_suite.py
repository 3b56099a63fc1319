"""NVSHMEM's collective launch of a real kernel, on one PE: GPU 0, a unique id, no MPI.

    python tests/gpu/nvshmem_launch_suite.py

The kernel is PTX written here (``fill(int* out, int value)``: ``out[i] = value + i``), loaded
with cuda.bindings' ``cuLibraryLoadData`` (context-independent, as cuda.core loads code), so the
suite needs the driver but no compiler. It reports one line per check and a summary
(tests/gpu/runner.py). A ``CUfunction`` is passed too: CUDA documents a ``CUkernel``
(``cudaKernel_t``) as what the runtime launches through ``const void* func``, not a ``CUfunction``,
so its failure is an XFAIL.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Before anything loads CUDA or NVSHMEM in this process.
for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ.setdefault(_name, _value)

import numpy as np  # noqa: E402
from cuda.bindings import driver as cu  # noqa: E402
from runner import Check, Checks, KnownLimitation, Report, expect, main  # noqa: E402

from mpbind.bindings import nvshmem as nv  # noqa: E402
from mpbind.errors import NVSHMEMError  # noqa: E402

# out[blockIdx.x * blockDim.x + threadIdx.x] = value + that index (PTX 7.0: any CUDA 11+ driver JITs it).
PTX = b"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry fill(.param .u64 out, .param .u32 value)
{
    .reg .b32 %r<7>;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [value];
    cvta.to.global.u64 %rd2, %rd1;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    add.s32 %r6, %r5, %r1;
    mul.wide.s32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    st.global.u32 [%rd4], %r6;
    ret;
}
"""
THREADS = 128


def checked(result: tuple[Any, ...]) -> Any:
    """The value of a cuda.bindings call, raising on an error."""
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver error {err}")
    return values[0] if len(values) == 1 else tuple(values) or None


@dataclass
class KernelObject:
    """cuda.core's Kernel as the binding sees it: its `handle` is the CUkernel."""

    handle: Any


@dataclass
class Launch:
    kernel: Any  # the CUkernel
    max_grid: int  # collective_launch_query_gridsize for THREADS threads
    buffer: int  # device memory for max_grid * THREADS ints

    def arguments(self, value: int) -> tuple[list[int], list[Any]]:
        """kernelParams for fill(buffer, value), and the ctypes values they point to (kept alive)."""
        held = [ctypes.c_uint64(self.buffer), ctypes.c_int32(value)]
        return [ctypes.addressof(v) for v in held], held

    def result(self, count: int) -> np.ndarray:
        checked(cu.cuCtxSynchronize())
        host = np.empty(count, np.int32)
        checked(cu.cuMemcpyDtoH(host.ctypes.data, self.buffer, host.nbytes))
        return host

    def clear(self) -> None:
        checked(cu.cuMemsetD32(self.buffer, 0, self.max_grid * THREADS))

    def expect_filled(self, blocks: int, value: int) -> str:
        got = self.result(blocks * THREADS)
        want = value + np.arange(blocks * THREADS, dtype=np.int32)
        expect(bool(np.array_equal(got, want)), f"{int(np.sum(got != want))} of {want.size} elements differ")
        return f"{blocks} blocks of {THREADS}"


def launch_with(launch: Launch, kernel: Any, blocks: int, value: int) -> str:
    launch.clear()
    args, _held = launch.arguments(value)
    nv.collective_launch(kernel, (blocks, 1, 1), THREADS, args, 0, 0)
    return launch.expect_filled(blocks, value)


def launch_attr(launch: Launch, blocks: int, value: int) -> str:
    launch.clear()
    args, _held = launch.arguments(value)
    config = nv.LaunchConfig(gridDim=nv.Dim3(x=blocks, y=1, z=1), blockDim=nv.Dim3(x=THREADS, y=1, z=1),
                             dynamicSmemBytes=0, stream=0)
    nv.collective_launch_attr(nv.CollectiveLaunchAttr(cuda_config=config), launch.kernel, args)
    return launch.expect_filled(blocks, value)


def launch_array_address(launch: Launch, blocks: int, value: int) -> str:
    """kernelParams given as the address of a void* array (as cuda-bindings' cuLaunchKernel takes)."""
    launch.clear()
    args, _held = launch.arguments(value)
    array = (ctypes.c_void_p * len(args))(*args)
    nv.collective_launch(launch.kernel, blocks, THREADS, ctypes.addressof(array), 0, 0)
    return launch.expect_filled(blocks, value)


def launch_grid_zero(launch: Launch) -> str:
    """A grid of 0 blocks is refused by the library (a status, not a launch of some other size)."""
    args, _held = launch.arguments(1)
    try:
        nv.collective_launch(launch.kernel, 0, THREADS, args, 0, 0)
    except NVSHMEMError as exc:
        expect(exc.status == nv.Status.ERROR_COLLECTIVE_LAUNCH_FAILED, f"status {exc.status_name}")
        return str(exc.status_name)
    raise AssertionError("a grid of 0 blocks launched")


def launch_too_large(launch: Launch) -> str:
    args, _held = launch.arguments(1)
    try:
        nv.collective_launch(launch.kernel, launch.max_grid + 1, THREADS, args, 0, 0)
    except NVSHMEMError as exc:
        expect(exc.status == nv.Status.ERROR_COLLECTIVE_LAUNCH_FAILED, f"status {exc.status_name}")
        return str(exc.status_name)
    raise AssertionError(f"a grid of {launch.max_grid + 1} blocks launched cooperatively")


def launch_cufunction(launch: Launch, blocks: int, value: int) -> str:
    function = checked(cu.cuKernelGetFunction(launch.kernel))
    try:
        return launch_with(launch, function, blocks, value)
    except (NVSHMEMError, AssertionError) as exc:
        raise KnownLimitation(f"a CUfunction is not a kernel the CUDA runtime launches: {exc}") from exc


def setup(launches: list[Launch]) -> str:
    """Initialise NVSHMEM on GPU 0 alone, load the kernel, query its grid size, allocate the output."""
    checked(cu.cuInit(0))
    device = checked(cu.cuDeviceGet(0))
    checked(cu.cuCtxSetCurrent(checked(cu.cuDevicePrimaryCtxRetain(device))))  # the runtime's context
    attr = nv.InitAttr()
    nv.set_attr_uniqueid_args(0, 1, nv.get_uniqueid(), attr)
    nv.init_attr(nv.InitFlags.WITH_UNIQUEID, attr)
    library = checked(cu.cuLibraryLoadData(PTX + b"\0", [], [], 0, [], [], 0))
    kernel = checked(cu.cuLibraryGetKernel(library, b"fill"))
    max_grid = nv.collective_launch_query_gridsize(kernel, THREADS, None, 0)
    expect(max_grid > 0, f"collective_launch_query_gridsize: {max_grid}")
    launches.append(Launch(kernel, max_grid, int(checked(cu.cuMemAlloc(max_grid * THREADS * 4)))))
    return f"query_gridsize: {max_grid} blocks of {THREADS} threads"


CHECKS = Checks()


@CHECKS.cases
def launch_checks(launches: list[Launch]) -> Iterator[Check]:
    yield "launch.setup", lambda: setup(launches)
    if launches:
        launch = launches[0]
        blocks = min(4, launch.max_grid)
        kernel = launch.kernel
        yield "launch.cukernel", lambda: launch_with(launch, kernel, blocks, 7)
        yield "launch.kernel_object", lambda: launch_with(launch, KernelObject(kernel), blocks, 11)
        yield "launch.int_address", lambda: launch_with(launch, int(kernel), blocks, 13)
        yield "launch.args_array_address", lambda: launch_array_address(launch, blocks, 17)
        yield "launch.grid_zero", lambda: launch_grid_zero(launch)
        yield "launch.grid_too_large", lambda: launch_too_large(launch)
        yield "launch.attr", lambda: launch_attr(launch, blocks, 23)
        yield "launch.cufunction", lambda: launch_cufunction(launch, blocks, 29)
        yield "launch.free", lambda: checked(cu.cuMemFree(launch.buffer))
    yield "finalize", nv.finalize


@contextlib.contextmanager
def started(args: argparse.Namespace, report: Report) -> Iterator[list[Launch]]:
    yield []  # the set-up is the first check: the others need what it made


if __name__ == "__main__":
    sys.exit(main(__doc__, started, CHECKS, timeout=150.0))
