"""Where the NVSHMEM benchmarks put their PEs: one per GPU, or every PE on GPU 0."""

from __future__ import annotations

import argparse


def add_placement_argument(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--placement", choices=("per-gpu", "shared"), default=None,
                    help="one PE per GPU, or every PE on GPU 0 (default: per-gpu when there are enough GPUs)")


def placement_and_device(asked: str | None, pe: int, npes: int, gpus: int) -> tuple[str, int]:
    """(placement, this PE's device): per-gpu puts PE k on GPU k, shared puts every PE on GPU 0."""
    placement = asked or ("per-gpu" if gpus >= npes else "shared")
    if placement == "per-gpu" and gpus < npes:
        raise SystemExit(f"{npes} PEs but {gpus} GPUs: use --placement shared")
    return placement, (pe if placement == "per-gpu" else 0)
