"""mpbind.cublasmp on one GPU with one rank: the grid cache, descriptors, workspaces,
registrations and a distributed matmul built only from this layer, checked against torch.matmul."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from mpbind._infra import loader as _loader  # noqa: E402
from mpbind.errors import LibraryNotFoundError, UsageError  # noqa: E402

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU", allow_module_level=True)
try:
    _loader.load("cublasmp")
except LibraryNotFoundError as _exc:
    pytest.skip(f"the cuBLASMp library is not available: {_exc}", allow_module_level=True)

from mpbind import cublasmp, nccl  # noqa: E402


@pytest.fixture
def comm() -> Iterator[nccl.Communicator]:
    torch.cuda.set_device(0)
    c = nccl.Communicator.init(1, 0, nccl.get_unique_id())
    yield c
    torch.cuda.synchronize()
    c.close()


@pytest.fixture
def stream() -> Iterator[object]:
    s = torch.cuda.Stream()
    yield s
    s.synchronize()


def _rand(m: int, n: int, seed: int) -> object:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.rand((m, n), generator=g, device="cuda", dtype=torch.float64) * 2 - 1


def test_grid_cache(comm: nccl.Communicator) -> None:
    before = cublasmp.grid_cache_info()
    g1 = cublasmp.grid(comm, 1, 1)
    g2 = cublasmp.grid(comm, 1, 1)
    after = cublasmp.grid_cache_info()
    assert g1.handle == g2.handle
    assert after["hits"] == before["hits"] + 1 and after["misses"] == before["misses"] + 1
    g3 = cublasmp.grid(comm, 1, 1, cublasmp.GridLayout.ROW_MAJOR)
    assert g3.handle != g1.handle
    entries = cublasmp.grid_cache_info()["entries"]
    comm.close()  # grids go with their communicator
    assert g1.closed and g3.closed
    assert cublasmp.grid_cache_info()["entries"] == entries - 2
    with pytest.raises(UsageError, match="closed"):
        _ = g1.handle


def test_grid_validation(comm: nccl.Communicator) -> None:
    with pytest.raises(UsageError, match="needs 2 ranks"):
        cublasmp.grid(comm, 2, 1)
    with pytest.raises(UsageError, match="layout"):
        cublasmp.grid(comm, 1, 1, 5)
    with pytest.raises(TypeError):
        cublasmp.grid(object(), 1, 1)
    g = cublasmp.grid(comm, 1, 1)
    f32 = int(cublasmp.DATA_TYPES["float32"])
    with pytest.raises(UsageError, match="lld 3 < 4 local rows"):  # columns 3 apart would overlap 4 rows
        g.matrix_descriptor(4, 5, 4, 5, 0, 0, 3, f32)
    d = g.matrix_descriptor(4, 5, 4, 5, 0, 0, 4, f32)
    d.close()


@pytest.mark.parametrize(("dtype", "tol"), [("float32", 1e-4), ("bfloat16", 3e-2), ("float64", 1e-10)])
def test_planned_matmul_matches_torch(comm: nccl.Communicator, stream: object, dtype: str, tol: float) -> None:
    tdt = getattr(torch, dtype)
    m, n, k = 256, 192, 320
    a = _rand(m, k, 1).to(tdt)
    b = _rand(k, n, 2).to(tdt)
    d = torch.full((m, n), float("nan"), device="cuda", dtype=tdt)
    torch.cuda.synchronize()
    handle = cublasmp.Handle(stream)
    grid = cublasmp.grid(comm, 1, 1)
    # Row-major torch tensors as column-major matrices: D^T = B^T A^T.
    mb = cublasmp.Matrix(grid, b.T)
    ma = cublasmp.Matrix(grid, a.T)
    md = cublasmp.Matrix(grid, d.T)
    with cublasmp.Matmul(handle, mb, ma, md) as plan:
        assert plan.workspace_size[0] >= 0
        plan.execute()
        plan.execute(stream)  # again, on an explicit stream
    stream.synchronize()
    ref = a.double() @ b.double()
    err = float((d.double() - ref).abs().max() / ref.abs().max())
    assert err < tol, err
    handle.close()


def test_matmul_descriptor_ownership(comm: nccl.Communicator, stream: object) -> None:
    """A plan closes the descriptor it made or was handed (own_descriptor=True); one passed in
    otherwise stays the caller's, and a plan whose kept descriptor was closed refuses to run."""
    a, b, d = (torch.zeros((64, 64), device="cuda") for _ in range(3))
    torch.cuda.synchronize()
    handle = cublasmp.Handle(stream)
    grid = cublasmp.grid(comm, 1, 1)
    mats = [cublasmp.Matrix(grid, x.T) for x in (b, a, d)]
    with cublasmp.Matmul(handle, *mats) as made:
        assert made.owns_descriptor
    assert made.closed and made.descriptor.closed
    mine = cublasmp.MatmulDescriptor(cublasmp.CublasComputeType.COMPUTE_32F)
    with cublasmp.Matmul(handle, *mats, descriptor=mine) as kept:
        assert not kept.owns_descriptor
        kept.execute()
    assert not mine.closed
    plan = cublasmp.Matmul(handle, *mats, descriptor=mine)
    mine.close()
    with pytest.raises(UsageError, match="closed"):
        plan.execute()
    plan.close()
    given = cublasmp.MatmulDescriptor(cublasmp.CublasComputeType.COMPUTE_32F)
    with cublasmp.Matmul(handle, *mats, descriptor=given, own_descriptor=True) as owner:
        assert owner.owns_descriptor
    assert given.closed
    for mat in mats:
        with mat:
            assert "MatrixDescriptor 64x64" in repr(mat)
        assert mat.closed and mat.descriptor.closed
    stream.synchronize()
    handle.close()


def test_matmul_transposed_with_c_and_beta(comm: nccl.Communicator, stream: object) -> None:
    m, n, k = 128, 64, 96
    a_t = _rand(k, m, 3).float()  # stores op(A)^T row-major = A column-major (k x m) ... use transa
    b = _rand(k, n, 4).float()
    c = _rand(m, n, 5).float()
    d = torch.zeros((m, n), device="cuda")
    torch.cuda.synchronize()
    handle = cublasmp.Handle(stream)
    grid = cublasmp.grid(comm, 1, 1)
    # D^T (n x m) = B^T (n x k) @ A_t (k x m) with A_t = A^T: op(X)=X for B^T, and A_t given transposed.
    ma = cublasmp.Matrix(grid, a_t.T)  # A, column-major m x k; op = transpose gives A^T
    mb = cublasmp.Matrix(grid, b.T)
    mc = cublasmp.Matrix(grid, c.T)
    md = cublasmp.Matrix(grid, d.T)
    cublasmp.matmul(handle, mb, ma, md, mc, transb=True, alpha=2.0, beta=-1.0, stream=stream)
    stream.synchronize()
    ref = 2.0 * (a_t.T.double() @ b.double()) - c.double()
    assert float((d.double() - ref).abs().max()) < 1e-3
    with pytest.raises(UsageError, match="op\\(A\\)"):
        cublasmp.Matmul(handle, mb, mb, md)
    with pytest.raises(UsageError, match="beta"):
        cublasmp.Matmul(handle, mb, ma, md, transb=True, beta=1.0)
    handle.close()


def test_gemm_matches_torch(comm: nccl.Communicator, stream: object) -> None:
    m, n, k = 96, 80, 64
    a = _rand(m, k, 6)
    b = _rand(k, n, 7)
    c = torch.zeros((m, n), device="cuda", dtype=torch.float64)
    torch.cuda.synchronize()
    handle = cublasmp.Handle(stream)
    grid = cublasmp.grid(comm, 1, 1)
    cublasmp.gemm(handle, cublasmp.Matrix(grid, b.T), cublasmp.Matrix(grid, a.T), cublasmp.Matrix(grid, c.T),
                  stream=stream)
    stream.synchronize()
    assert float((c - a @ b).abs().max()) < 1e-10
    handle.close()


def test_matmul_descriptor_attributes() -> None:
    with cublasmp.MatmulDescriptor(cublasmp.CublasComputeType.COMPUTE_32F, transa=cublasmp.CublasOperation.T) as d:
        assert d.transa == cublasmp.CublasOperation.T
        d.epilogue = cublasmp.MatmulEpilogue.RELU
        assert d.epilogue == cublasmp.MatmulEpilogue.RELU
        d.communication_sm_count = 4
        assert d.communication_sm_count == 4
        with pytest.raises(TypeError):
            cublasmp.MatmulDescriptor(nonsense=1)
    assert d.closed


def test_workspace_and_registration_refcounts(comm: nccl.Communicator) -> None:
    grid = cublasmp.grid(comm, 1, 1)
    grid2 = cublasmp.grid(comm, 1, 1, cublasmp.GridLayout.ROW_MAJOR)
    ws = cublasmp.Workspace(grid, 1 << 20)
    ws.serve([grid2])
    assert ws.grids == 2
    mine = [r for r in nccl.registrations() if r["ptr"] == ws.ptr]
    assert len(mine) == 1 and mine[0]["library"] == "cublasmp"
    buf = nccl.mem_alloc(1 << 20)
    r1 = grid.register(buf.ptr, buf.nbytes, buf)
    r2 = grid.register(buf.ptr, buf.nbytes, buf)
    assert r1.references == 2
    r1.close()
    assert r2.references == 1
    r2.close()
    assert not [r for r in grid.registrations() if r["ptr"] == buf.ptr]
    ws.close()
    assert not [r for r in nccl.registrations() if r["ptr"] == ws.ptr]
    r3 = grid.register(buf.ptr, buf.nbytes, buf)
    comm.close()
    assert r3.closed and grid.closed


def test_threads_share_the_grid_cache(comm: nccl.Communicator) -> None:
    import threading

    grids: list = []
    lock = threading.Lock()

    def work() -> None:
        for _ in range(10):
            g = cublasmp.grid(comm, 1, 1)
            with lock:
                grids.append(g.handle)

    threads = [threading.Thread(target=work) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(grids)) == 1 and len(grids) == 160


def test_captured_matmul_replays_on_new_inputs(comm: nccl.Communicator, stream: object) -> None:
    m = n = k = 128
    a = _rand(m, k, 8).float()
    b = _rand(k, n, 9).float()
    d = torch.zeros((m, n), device="cuda")
    torch.cuda.synchronize()
    handle = cublasmp.Handle(stream)
    grid = cublasmp.grid(comm, 1, 1)
    plan = cublasmp.Matmul(handle, cublasmp.Matrix(grid, b.T), cublasmp.Matrix(grid, a.T), cublasmp.Matrix(grid, d.T))
    with pytest.raises(UsageError, match="default"):
        plan.capture(0)
    plan.capture(stream)
    assert plan.captured
    with pytest.raises(UsageError, match="already"):
        plan.capture(stream)
    with torch.cuda.stream(stream):
        a.mul_(-2)  # the replay reads the operands' current contents
    plan.execute()
    stream.synchronize()
    assert float((d - a @ b).abs().max()) < 1e-3
    plan.close()
    with pytest.raises(UsageError, match="closed"):
        plan.execute()
    handle.close()
