"""The collective matmul's checks without a GPU: the ring kernel of method="kernel" compiles and
links, and the plan's arguments are refused the same way on every PE (from the rows the PEs
exchange), naming the PE and what differs."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("cuda.core", reason="cuda-core is not installed (pip install 'mpbind[kernels]')")

from mpbind import collective as collective_matmul  # noqa: E402
from mpbind import kernels as nk  # noqa: E402
from mpbind.errors import UsageError  # noqa: E402
from mpbind.kernels import _build as _kernel_build  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from fake_groups import Scripted, sent  # noqa: E402

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


def _sent(*args: object) -> list[int]:
    """What a PE making the plan with `args` sends in the agreement."""
    return sent(lambda group: collective_matmul._agreed(group, *args))


def _agreed(mine: tuple[object, ...], *others: tuple[object, ...]) -> str:
    """PE 0's side of the agreement, the other PEs having passed `others`."""
    return collective_matmul._agreed(Scripted(*(_sent(*o) for o in others), unit="PE"), *mine)


@pytest.mark.parametrize(("args", "match"), [
    ((-1, 4096, 4096, "float16", "host", 16), "positive ints"),
    ((0, 4096, 4096, "float16", "host", 16), "positive ints"),
    ((1024, 4096, 4096, "int8", "host", 16), "dtype must be one of"),
    ((1024, 4096, 4096, "float16", "nccl", 16), "method must be one of"),
    ((1024, 4096, 4096, "float16", "kernel", 0), "ctas"),
])
def test_a_refusal_on_one_pe_is_raised_on_every_pe(args: tuple[object, ...], match: str) -> None:
    with pytest.raises(UsageError, match=f"^AllGatherMatmul refused on PE 1: .*{match}"):
        _agreed(GOOD, args, GOOD)
    with pytest.raises(UsageError, match=f"^AllGatherMatmul refused on PE 0: .*{match}"):
        _agreed(args, GOOD, GOOD)


def test_pes_with_other_shapes_are_refused_naming_the_difference() -> None:
    with pytest.raises(UsageError, match="same arguments on every PE: PE 2 passed others than PE 0 "
                                         r"\(n=4096 on PE 0, 8192 on PE 2\)"):
        _agreed(GOOD, GOOD, (1024, 4096, 8192, "float16", "host", 16))


def test_the_same_arguments_everywhere_pass() -> None:
    assert _agreed(GOOD, GOOD, GOOD, GOOD) == "float16"
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
