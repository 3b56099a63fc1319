"""Helpers of the GPU benchmarks that need no mpbind (nvmath-python's processes in
``planned_matmul_host.py`` import none): the error of a result, and which NCCL libraries the process
mapped."""

from __future__ import annotations

from typing import Any


def relative_error(got: Any, want: Any) -> float:
    """max |got - want| / max |want|, in float32."""
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def mapped_nccl() -> str:
    """Every libnccl mapped into this process (LD_PRELOAD puts one in front of torch's own)."""
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if "/" in line and "libnccl" in line.rsplit("/", 1)[-1]}
    return ", ".join(sorted(paths)) or "none"
