"""Host time of a planned matmul's execute through mpbind.cublasmp, against nvmath-python, in one run.

    python benchmarks/layer_matmul.py [--size 256] [--calls 2000] [--json]

One rank, one GPU, bf16 ``size^3`` with fp32 compute. Each figure is the median wall time of
one call (``perf_counter`` around it, nothing synchronised inside the loop):

* ``mpbind.cublasmp.Matmul.execute()``: the planned matmul of the Pythonic layer, called
  directly and after ``capture()`` (one CUDA graph replay per execute);
* the flat ``mpbind.bindings.cublasmp.matmul(...)`` call with the same arguments (the floor the
  layer adds to);
* nvmath-python's ``nvmath.distributed.linalg.advanced.Matmul.execute()`` on the same operands
  (needs nvmath-python and mpi4py; reported as unavailable otherwise);
* ``torch.matmul`` as a familiar anchor.

Every result is checked against torch.matmul before it is timed.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
from collections.abc import Callable
from typing import Any

for _name, _value in (("NCCL_NVLS_ENABLE", "0"), ("NVSHMEM_DISABLE_NVLS", "1"),
                      ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")):
    os.environ.setdefault(_name, _value)

import numpy as np  # noqa: E402
import torch  # noqa: E402
from cublasmp_matmul import host_times_us  # noqa: E402  (beside this script)

from mpbind import cublasmp, nccl  # noqa: E402
from mpbind._infra import loader as _loader  # noqa: E402
from mpbind.bindings import cublasmp as flat  # noqa: E402


def host_us(fn: Callable[[], object], calls: int) -> float:
    return statistics.median(host_times_us(fn, calls, warmup=50, sync_every=200))


def nvmath_execute(a: Any, b: Any, ref: Any, calls: int) -> dict[str, Any]:
    try:
        import nvmath.distributed
        from mpi4py import MPI
        from nvmath.distributed.distribution import Slab
        from nvmath.distributed.linalg.advanced import Matmul
    except Exception as exc:  # noqa: BLE001 - report why the anchor is missing
        return {"unavailable": f"{type(exc).__name__}: {exc}"}
    try:
        nvmath.distributed.initialize(0, MPI.COMM_WORLD, backends=["nccl"])
        a_f, b_f = a.T.contiguous().T, b.T.contiguous().T  # Fortran order, as cuBLASMp wants
        mm = Matmul(a_f, b_f, distributions=[Slab.X, Slab.Y, Slab.X],
                    stream=torch.cuda.current_stream())
        mm.plan()
        out = mm.execute()
        torch.cuda.synchronize()
        err = float((out.double() - ref).abs().max() / ref.abs().max())
        us = host_us(mm.execute, calls)
        mm.free()
        return {"execute_us": us, "rel_err": err, "version": nvmath.__version__}
    except Exception as exc:  # noqa: BLE001
        return {"unavailable": f"{type(exc).__name__}: {exc}"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    n = args.size

    torch.cuda.set_device(0)
    stream = torch.cuda.Stream()
    torch.cuda.set_stream(stream)
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn((n, n), generator=g, device="cuda").to(torch.bfloat16)
    b = torch.randn((n, n), generator=g, device="cuda").to(torch.bfloat16)
    d = torch.empty((n, n), device="cuda", dtype=torch.bfloat16)
    ref = a.double() @ b.double()
    rows: dict[str, Any] = {}

    with nccl.Communicator.init(1, 0, nccl.get_unique_id()) as comm, cublasmp.Handle(stream) as handle:
        grid = cublasmp.grid(comm, 1, 1)
        # Row-major torch tensors as column-major matrices: D^T = B^T A^T.
        plan = cublasmp.Matmul(handle, cublasmp.Matrix(grid, b.T), cublasmp.Matrix(grid, a.T),
                               cublasmp.Matrix(grid, d.T))
        plan.execute()
        torch.cuda.synchronize()
        rows["mpbind_rel_err"] = float((d.double() - ref).abs().max() / ref.abs().max())
        rows["mpbind_execute_us"] = host_us(plan.execute, args.calls)
        captured = cublasmp.Matmul(handle, cublasmp.Matrix(grid, b.T), cublasmp.Matrix(grid, a.T),
                                   cublasmp.Matrix(grid, d.T)).capture(stream)
        d.zero_()
        captured.execute()
        torch.cuda.synchronize()
        rows["mpbind_captured_rel_err"] = float((d.double() - ref).abs().max() / ref.abs().max())
        rows["mpbind_captured_execute_us"] = host_us(captured.execute, args.calls)
        captured.close()

        # The same call through the flat bindings.
        mb, ma, md = (cublasmp.Matrix(grid, x.T) for x in (b, a, d))
        mm = cublasmp.MatmulDescriptor(cublasmp.CublasComputeType.COMPUTE_32F)
        alpha, beta = ctypes.c_float(1.0), ctypes.c_float(0.0)
        head = (handle.handle, mm.handle, n, n, n, ctypes.addressof(alpha), mb.ptr, 1, 1, mb.descriptor.handle,
                ma.ptr, 1, 1, ma.descriptor.handle, ctypes.addressof(beta), 0, 1, 1, 0, md.ptr, 1, 1,
                md.descriptor.handle)
        dev_bytes, host_bytes = flat.matmul_buffer_size(*head)
        ws = cublasmp.Workspace(grid, max(1, dev_bytes))
        host = np.zeros(max(1, host_bytes), dtype=np.uint8)
        full = (*head, ws.ptr, dev_bytes, int(host.ctypes.data), host_bytes)
        rows["flat_call_us"] = host_us(lambda: flat.matmul(*full), args.calls)
        rows["torch_matmul_us"] = host_us(lambda: torch.matmul(a, b, out=d), args.calls)
        torch.cuda.synchronize()
        ws.close()
        plan.close()

    rows["nvmath"] = nvmath_execute(a, b, ref, args.calls)
    info = {"gpu": torch.cuda.get_device_name(0), "cublasmp": _loader.loaded_version("cublasmp"),
            "nccl": _loader.loaded_version("nccl"), "torch": torch.__version__}
    if args.json:
        print(json.dumps({"info": info, "size": n, "results": rows}, indent=1))
        return 0
    print(f"{info['gpu']}: cuBLASMp {info['cublasmp']}, NCCL {info['nccl']}; 1 rank; bf16 {n}^3, fp32 compute")
    print(f"  mpbind.cublasmp.Matmul.execute()   {rows['mpbind_execute_us']:8.2f} us   "
          f"(rel. error vs float64 {rows['mpbind_rel_err']:.2e})")
    print(f"  ... after Matmul.capture()         {rows['mpbind_captured_execute_us']:8.2f} us   "
          f"(rel. error vs float64 {rows['mpbind_captured_rel_err']:.2e})")
    print(f"  flat bindings cublasmp.matmul()    {rows['flat_call_us']:8.2f} us")
    nv = rows["nvmath"]
    if "execute_us" in nv:
        print(f"  nvmath-python Matmul.execute()     {nv['execute_us']:8.2f} us   (nvmath {nv['version']}; "
              f"ratios mpbind/nvmath {rows['mpbind_execute_us'] / nv['execute_us']:.3f} direct, "
              f"{rows['mpbind_captured_execute_us'] / nv['execute_us']:.3f} captured)")
    else:
        print(f"  nvmath-python Matmul.execute()     unavailable: {nv['unavailable']}")
    print(f"  torch.matmul(out=)                 {rows['torch_matmul_us']:8.2f} us")
    print(f"  (median of {args.calls} calls each)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
