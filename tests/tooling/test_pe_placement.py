"""benchmarks/_pe_placement.py without a GPU: where the NVSHMEM benchmarks put their PEs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from _pe_placement import placement_and_device  # noqa: E402


def test_default_is_one_pe_per_gpu_when_there_are_enough() -> None:
    assert placement_and_device(None, 1, 2, 2) == ("per-gpu", 1)
    assert placement_and_device(None, 1, 2, 1) == ("shared", 0)
    assert placement_and_device("shared", 1, 2, 2) == ("shared", 0)


def test_per_gpu_without_enough_gpus_is_refused() -> None:
    with pytest.raises(SystemExit, match="2 PEs but 1 GPUs"):
        placement_and_device("per-gpu", 0, 2, 1)
