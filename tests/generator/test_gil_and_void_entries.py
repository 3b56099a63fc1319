"""The GIL policy the spec sets per function ([gil] keep and keep_matching), and the void entry points
of _internal, which return an int so that no caller takes the GIL to look for an exception."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

Generator = Callable[[str], ModuleType]


@pytest.fixture(scope="module")
def nvshmem(generate: ModuleType) -> Any:
    return generate.load_library("nvshmem")


@pytest.mark.parametrize("name", ["nvshmemx_putmem_on_stream", "nvshmemx_quiet_on_stream",
                                  "nvshmemx_putmem_signal_nbi_on_stream", "nvshmemx_signal_wait_until_on_stream",
                                  "nvshmemx_float_get_on_stream"])
def test_one_sided_calls_on_a_stream_keep_the_gil(nvshmem: Any, name: str) -> None:
    assert not nvshmem.function(name).releases_gil


@pytest.mark.parametrize("name", ["nvshmemx_barrier_all_on_stream", "nvshmemx_sync_all_on_stream",
                                  "nvshmemx_float_sum_reduce_on_stream", "nvshmemx_alltoallmem_on_stream",
                                  "nvshmemx_broadcastmem_on_stream", "nvshmemx_fcollectmem_on_stream",
                                  "nvshmem_quiet", "nvshmem_barrier_all", "nvshmem_malloc"])
def test_collectives_and_blocking_calls_release_it(nvshmem: Any, name: str) -> None:
    assert nvshmem.function(name).releases_gil


def test_a_void_function_reaches_c_through_an_int_entry_point(generator: Generator, nvshmem: Any) -> None:
    emit_cython = generator("emit_cython")
    f = nvshmem.function("nvshmemx_quiet_on_stream")
    internal = emit_cython.internal_pxd(nvshmem)
    assert "cdef int _nvshmemx_quiet_on_stream(cudaStream_t cstrm) except -1 nogil" in internal.splitlines()
    # cy<lib> keeps the C signature for the Cython code that cimports it
    assert "cdef void nvshmemx_quiet_on_stream(cudaStream_t cstrm) except * nogil" in \
        emit_cython.cy_pxd(nvshmem).splitlines()
    body = emit_cython.internal_pyx(nvshmem)
    start = body.index("cdef int _nvshmemx_quiet_on_stream(")
    assert body[start:].splitlines()[4].strip() == "return 0"
    flat = generator("emit_python").python_pyx(nvshmem)
    assert "    _nvshmem._nvshmemx_quiet_on_stream(<cudaStream_t>_h_cstrm)" in flat.splitlines()
    assert f.returns.name == "void"


def test_a_function_returning_a_value_keeps_its_exception_value(generator: Generator, nvshmem: Any) -> None:
    internal = generator("emit_cython").internal_pxd(nvshmem)
    assert "cdef int _nvshmem_my_pe() except?-1 nogil" in internal.splitlines()
