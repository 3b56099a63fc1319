"""mpbind demo: NCCL version and unique id, then a one-rank all-reduce on a GPU through mpbind.nccl.

Runs without a GPU (the all-reduce is skipped, with the reason printed). Exits
non-zero only if a check fails.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

import mpbind
from mpbind._infra import info as _info


def _cuda_check(result: Any) -> Any:
    """Unpack a ``cuda.bindings.runtime`` result tuple, raising on an error status."""
    from cuda.bindings import runtime as cudart

    err, *values = result if isinstance(result, tuple) else (result,)
    if err != cudart.cudaError_t.cudaSuccess:
        _, name = cudart.cudaGetErrorName(err)
        text = name.decode() if isinstance(name, bytes) else str(name)
        raise RuntimeError(f"CUDA runtime error {text}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def nccl_version_string(code: int) -> str:
    """Decode ``ncclGetVersion``'s integer (``major*10000 + minor*100 + patch``)."""
    return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"


def all_reduce_one_rank(uid: Any, count: int = 1 << 20) -> bool:
    """Sum-all-reduce ``count`` float32 values on one rank through mpbind.nccl; compare with NumPy."""
    from cuda.bindings import runtime as cudart

    from mpbind import nccl

    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    host = np.arange(count, dtype=np.float32) * np.float32(0.5)
    expected = host.copy()  # the sum over a single rank
    nbytes = host.nbytes
    to_device = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
    to_host = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost

    _cuda_check(cudart.cudaSetDevice(0))
    # The communicator owns what depends on it: leaving the block deregisters, then destroys.
    with nccl.Communicator.init(1, 0, uid) as comm, nccl.mem_alloc(nbytes) as send, \
            nccl.mem_alloc(nbytes) as recv:
        print(f"  {comm!r}")
        _cuda_check(cudart.cudaMemcpy(send.ptr, host.ctypes.data, nbytes, to_device))
        reg = comm.register(send)
        again = comm.register(send)  # the same buffer again: one NCCL registration, two references
        print(f"  registered {send!r}: {reg.references} references, {len(nccl.registrations())} registration")
        comm.all_reduce((send.ptr, count, "float32"), (recv.ptr, count, "float32"), op="sum")
        _cuda_check(cudart.cudaDeviceSynchronize())
        result = np.empty_like(host)
        _cuda_check(cudart.cudaMemcpy(result.ctypes.data, recv.ptr, nbytes, to_host))
        again.close()
        reg.close()

    ok = bool(np.array_equal(result, expected))
    if ok:
        print(f"  all_reduce(SUM) of {count} float32 on 1 rank: matches NumPy")
    else:
        bad = int(np.count_nonzero(result != expected))
        print(f"  all_reduce(SUM) of {count} float32 on 1 rank: MISMATCH in {bad} elements")
    return ok


def poisson_on_every_gpu(count: int) -> bool:
    """examples/poisson3d.py under mpirun, one process per GPU (skipped below two GPUs, or without mpirun,
    mpi4py or CuPy)."""
    if count < 2:
        print(f"skipped: Poisson solve (examples/poisson3d.py) needs more than one GPU; {count} visible")
        return True
    import importlib.util
    import shutil
    import subprocess
    from pathlib import Path

    mpirun = shutil.which("mpirun")
    missing = [m for m in ("mpi4py", "cupy") if importlib.util.find_spec(m) is None]
    if mpirun is None or missing:
        print(f"skipped: Poisson solve on {count} GPUs (needs {'mpirun' if mpirun is None else ', '.join(missing)})")
        return True
    forward = [a for name in ("PYTHONPATH", "LD_LIBRARY_PATH") if os.environ.get(name) for a in ("-x", name)]
    cmd = [mpirun, "--allow-run-as-root", "--bind-to", "none", "-np", str(count), "-x", "NCCL_NVLS_ENABLE=0",
           "-x", "NVSHMEM_DISABLE_NVLS=1", "-x", "TORCH_SYMM_MEM_DISABLE_MULTICAST=1", *forward, sys.executable,
           str(Path(__file__).with_name("poisson3d.py")), "--n", "64"]
    print(f"Poisson solve on {count} GPUs (mpbind.fft, one process per GPU):")
    return subprocess.run(cmd, timeout=600).returncode == 0


def main() -> int:
    print(f"mpbind {mpbind.__version__}")
    from mpbind.bindings import nccl

    code = nccl.get_version()
    print(f"NCCL: version {nccl_version_string(code)} (ncclGetVersion -> {code})")

    uid = nccl.get_unique_id()
    raw = bytes(uid)
    if len(raw) != 128:
        print(f"FAIL: unique id has {len(raw)} bytes, expected 128")
        return 1
    print(f"NCCL: unique id of {len(raw)} bytes: {raw[:16].hex()}...")

    count, reason = _info.gpu_count()
    import tp_mlp  # beside this script: on every GPU, one process each; skipped (saying why) below two GPUs

    if count == 0:
        print(f"skipped: one-rank all-reduce (no GPU visible: {reason})")
        return 0 if poisson_on_every_gpu(count) and tp_mlp.on_every_gpu(count) else 1
    print(f"GPU: {count} visible; one-rank all-reduce on device 0")
    ok = all_reduce_one_rank(uid)
    ok = poisson_on_every_gpu(count) and ok
    return 0 if tp_mlp.on_every_gpu(count) and ok else 1


if __name__ == "__main__":
    sys.exit(main())
