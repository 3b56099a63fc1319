"""A small typed program using the flat cuFFTMp bindings; `mypy --strict` must accept it.

It is also runnable: it needs libcufftMp (from the nvidia-cufftmp-cu13 wheel) but no GPU, and it
makes no plan.
"""

from __future__ import annotations

from mpbind.bindings import cufftmp
from mpbind.errors import CuFFTMpError, CuFFTMpInvalidPlanError, LibraryError


def version() -> tuple[int, int, int]:
    major: int = cufftmp.get_property(cufftmp.LibraryPropertyType.MAJOR_VERSION)
    minor: int = cufftmp.get_property(cufftmp.LibraryPropertyType.MINOR_VERSION)
    patch: int = cufftmp.get_property(cufftmp.LibraryPropertyType.PATCH_LEVEL)
    assert cufftmp.get_version() == major * 1000 + minor * 100 + patch
    return major, minor, patch


def slab_plan(comm: object, nx: int, ny: int, nz: int) -> tuple[int, int]:
    plan = cufftmp.create()
    work = cufftmp.mp_make_plan3d(plan, nx, ny, nz, cufftmp.Type.C2C, comm, cufftmp.CommType.MPI)
    return plan, work


def boxes(plan: int, lower: list[int], upper: list[int]) -> None:
    cufftmp.xt_set_distribution(plan, 3, lower, upper, lower, upper)


def forward(plan: int, data: int) -> None:
    cufftmp.exec_c2c(plan, data, data, cufftmp.FORWARD)


def first_gpu_buffer(descriptor: int) -> int:
    lib = cufftmp.LibXtDesc.from_ptr(descriptor)
    desc: cufftmp.XtDesc = cufftmp.XtDesc.from_ptr(lib.descriptor)
    data: tuple[int, ...] = desc.data
    return data[0]


def explain(error: LibraryError) -> str:
    if isinstance(error, CuFFTMpInvalidPlanError):
        return f"no such plan in {error.function}"
    if isinstance(error, CuFFTMpError):
        return f"{error.function} -> {error.status_name} ({error.status})"
    return str(error)


def main() -> None:
    print(version(), cufftmp.MAX_CUDA_DESCRIPTOR_GPUS, cufftmp.Type.C2C.name)
    print(explain(CuFFTMpInvalidPlanError("cufftExecC2C", 1, "CUFFT_INVALID_PLAN")))


if __name__ == "__main__":
    main()
