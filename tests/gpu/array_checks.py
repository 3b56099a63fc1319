"""How the suites compare a PE's result, fetched to the host, with what NumPy says it must be."""

from __future__ import annotations

from typing import Any

import numpy as np
from runner import expect

# At most this share of a result's words may equal, bit for bit and place by place, the buffer's input.
MAX_UNCHANGED = 0.05


def expect_equal(got: Any, want: Any, what: str = "result") -> None:
    """Element by element; a failure says how many differ and where the first is."""
    got_arr, want_arr = np.asarray(got), np.asarray(want)
    expect(got_arr.shape == want_arr.shape, f"{what}: shape {got_arr.shape} != expected {want_arr.shape}")
    if not np.array_equal(got_arr, want_arr):
        bad = np.argwhere(got_arr != want_arr)
        i = tuple(int(v) for v in bad[0])
        raise AssertionError(f"{what}: {len(bad)} of {want_arr.size} elements differ; first at {i}: "
                             f"got {got_arr[i]!r}, expected {want_arr[i]!r}")


def expect_close(got: np.ndarray, want: np.ndarray, rtol: float, what: str) -> float:
    """Max |got - want| within rtol * max |want|; returns that error relative to max |want| (0 when empty)."""
    expect(got.shape == want.shape, f"{what}: shape {got.shape} != expected {want.shape}")
    if want.size == 0:
        return 0.0
    expect(bool(np.all(np.isfinite(got))), f"{what}: {int(np.sum(~np.isfinite(got)))} non-finite values")
    scale = float(np.max(np.abs(want))) or 1.0
    diff = np.abs(got.astype(np.complex128) - want.astype(np.complex128))
    worst = float(np.max(diff))
    if worst > rtol * scale:
        i = tuple(int(v) for v in np.unravel_index(int(np.argmax(diff)), diff.shape))
        raise AssertionError(f"{what}: max |got - expected| = {worst:.3g} > {rtol:g} x max|expected| "
                             f"({scale:.3g}); {int(np.sum(diff > rtol * scale))} of {want.size} elements off; "
                             f"worst at {i}: got {got[i]!r}, expected {want[i]!r}")
    return worst / scale


def expect_changed(before: np.ndarray, after: np.ndarray, what: str) -> None:
    """The buffer the library wrote no longer holds its input (a distributed transform that hands its
    input back is the failure to look for): the raw words are compared place by place."""
    word = np.float64 if before.dtype in (np.float64, np.complex128) else np.float32
    a = np.ascontiguousarray(before).view(word).ravel()
    b = np.ascontiguousarray(after).view(word).ravel()
    n = min(a.size, b.size)
    same = int(np.sum(a[:n] == b[:n]))
    expect(same <= MAX_UNCHANGED * n,
           f"{what}: {same} of {n} words are unchanged from the input"
           + (" (the buffer still holds its input)" if same == n else ""))
