"""cuBLASMp host workspaces (Handle.host_workspace): a size beyond the documented cap (2**32 bytes)
is refused before anything is allocated, and an allocation never surfaces as a bare MemoryError.
Run through mpbind._core._testing.cublasmp_host_workspace: the handle's checks and allocation
without a handle, so on any machine."""

from __future__ import annotations

import numpy as np
import pytest

from mpbind import _core
from mpbind.errors import UsageError

CAP = 2**32


@pytest.mark.parametrize("nbytes", [CAP + 1, 2**40, 2**63 - 1, 2**64 - 1])
def test_sizes_past_the_cap_are_refused(nbytes: int) -> None:
    with pytest.raises(UsageError, match=rf"host_workspace: nbytes is {nbytes}; .* at most 2\*\*32 bytes"):
        _core._testing.cublasmp_host_workspace(nbytes)


@pytest.mark.parametrize("nbytes", [0, 1, 4096, np.uint32(2**32 - 1), CAP])
def test_sizes_up_to_the_cap_are_allocated_zeroed(nbytes: int) -> None:
    # calloc'd: up to 4 GiB of address space, pages only where touched.
    assert _core._testing.cublasmp_host_workspace(nbytes) is True


@pytest.mark.parametrize("nbytes", [-1, 2**64, 1.5, "8"])
def test_sizes_that_are_no_size_are_type_or_overflow_errors(nbytes: object) -> None:
    with pytest.raises((TypeError, OverflowError)):
        _core._testing.cublasmp_host_workspace(nbytes)  # type: ignore[arg-type]
