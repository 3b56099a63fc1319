"""The collective matmul's checks without a GPU: the ring kernel of method="kernel" compiles and
links, and the plan's arguments are refused the same way on every PE (from the rows the PEs
exchange), naming the PE and what differs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("cuda.core", reason="cuda-core is not installed (pip install 'mpbind[kernels]')")

from mpbind import collective as collective_matmul  # noqa: E402
from mpbind import kernels as nk  # noqa: E402
from mpbind.errors import UsageError  # noqa: E402
from mpbind.kernels import _build as _kernel_build  # noqa: E402

GOOD = (1024, 4096, 4096, "float16", "host", 16)


@pytest.fixture()
def cache(tmp_path: Path) -> Iterator[None]:
    old = os.environ.get(_kernel_build.CACHE_ENV)
    os.environ[_kernel_build.CACHE_ENV] = str(tmp_path)
    yield
    if old is None:
        del os.environ[_kernel_build.CACHE_ENV]
    else:
        os.environ[_kernel_build.CACHE_ENV] = old


def test_the_ring_kernel_compiles_and_links(cache: None) -> None:
    cubin = nk.compile(collective_matmul.KERNEL_SOURCE, name="ag_ring", arch="sm_90")
    assert cubin.kernels == ("ag_ring",)
    assert cubin.uses_nvshmem


def _row(*args: object) -> list[int]:
    code, name = collective_matmul._local_problem(*args, n_pes=3)
    m, k, n, dtype, method, ctas = args
    return [code, m, k, n, collective_matmul._DTYPES.index(name) if name else -1,
            collective_matmul._METHODS.index(method) if method in collective_matmul._METHODS else -1, ctas]


@pytest.mark.parametrize(("args", "match"), [
    ((1023, 4096, 4096, "float16", "host", 16), "must be even"),
    ((0, 4096, 4096, "float16", "host", 16), "positive ints"),
    ((1024, 4096, 4096, "int8", "host", 16), "dtype must be one of"),
    ((1024, 4096, 4096, "float16", "nccl", 16), "method must be one of"),
    ((1024, 4096, 4096, "float16", "kernel", 0), "ctas"),
])
def test_a_refusal_on_one_pe_is_raised_on_every_pe(args: tuple[object, ...], match: str) -> None:
    rows = [_row(*GOOD), _row(*args), _row(*GOOD)]
    with pytest.raises(UsageError, match=f"refused on PE 1: .*{match}"):
        collective_matmul._check_agreement(rows)


def test_pes_with_other_shapes_are_refused_naming_the_difference() -> None:
    rows = [_row(*GOOD), _row(*GOOD), _row(1024, 4096, 8192, "float16", "host", 16)]
    with pytest.raises(UsageError, match="n=4096 on PE 0, 8192 on PE 2"):
        collective_matmul._check_agreement(rows)


def test_the_same_arguments_everywhere_pass() -> None:
    collective_matmul._check_agreement([_row(*GOOD)] * 4)
    assert collective_matmul._local_problem(*GOOD, n_pes=4) == (0, "float16")
    assert collective_matmul._local_problem(8, 8, 8, "bfloat16", "kernel", 4, n_pes=4) == (0, "bfloat16")
    assert collective_matmul._local_problem(8, 8, 8, "bfloat16", "kernel", None, n_pes=4) == (0, "bfloat16")
    assert collective_matmul._local_problem(8, 8, 8, "bfloat16", "kernel", True, n_pes=4)[0] == 5


def test_a_plan_needs_the_runtime() -> None:
    from mpbind import nvshmem

    if nvshmem.is_initialized():
        pytest.skip("an NVSHMEM runtime is live in this process")
    with pytest.raises(UsageError):
        collective_matmul.AllGatherMatmul(*GOOD[:4])
