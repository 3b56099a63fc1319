"""mpbind's JAX functions without a GPU (JAX's CPU backend): the XLA FFI handlers registered, each
function's abstract evaluation and lowering (the custom call, its attributes, the output shapes),
their transposes (each gradient is the adjoint collective, or the FFT's transpose checked against
``jax.vjp`` of ``jnp.fft`` in double precision), the refusals of bad arguments, and the core's
launches refusing what they are given before any library call. The handlers' work, which calls NCCL
and cuFFTMp, runs in the GPU suite (tests/gpu/jax_suite.py)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp  # noqa: E402

import mpbind.jax as mpj  # noqa: E402
from mpbind import _core  # noqa: E402
from mpbind.errors import UsageError  # noqa: E402

jax.config.update("jax_enable_x64", True)

needs_handlers = pytest.mark.skipif(not mpj.available(), reason="this mpbind was built without jaxlib's FFI headers")
COMM = 7  # an id: abstract evaluation and lowering never look it up


def lowered(fn: Any, *args: Any) -> str:
    return jax.jit(fn).lower(*args).as_text()


@needs_handlers
def test_handlers_are_registered_for_cuda() -> None:
    names = set(_core.xla.handlers())
    assert names == {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "fft", "reshape", "matmul", "matmul_c"}
    major, minor = _core.xla.FFI_API_VERSION
    assert major == 0 and minor >= 1
    assert mpj.available()  # a second time: registered once


@needs_handlers
@pytest.mark.parametrize(("fn", "args", "shape", "target"), [
    (mpj._all_reduce, (COMM, 4, 0), (8, 3), "mpbind_all_reduce"),
    (mpj._all_gather, (COMM, 4), (32, 3), "mpbind_all_gather"),
    (mpj._reduce_scatter, (COMM, 4, 4), (2, 3), "mpbind_reduce_scatter"),
    (mpj._all_to_all, (COMM, 4), (8, 3), "mpbind_all_to_all"),
], ids=["all_reduce", "all_gather", "reduce_scatter", "all_to_all"])
def test_collectives_abstract_evaluation_and_lowering(fn: Any, args: tuple[int, ...], shape: tuple[int, ...],
                                                      target: str) -> None:
    x = jnp.ones((8, 3), jnp.float32)
    out = jax.eval_shape(lambda v: fn(v, *args), x)
    assert out.shape == shape and out.dtype == jnp.float32
    text = lowered(lambda v: fn(v, *args), x)
    assert f"@{target}" in text or f'"{target}"' in text
    assert f"comm = {COMM} : ui64" in text


def test_gather_of_a_scalar_is_one_element_per_rank() -> None:
    assert jax.eval_shape(lambda v: mpj._all_gather(v, COMM, 3), jnp.float32(1)).shape == (3,)


def _targets(fn: Any, *args: Any) -> list[str]:
    """The mpbind custom calls of `fn`'s jaxpr, in order."""
    return re.findall(r"target_name=mpbind_(\w+)", str(jax.make_jaxpr(fn)(*args)))


@pytest.mark.parametrize(("forward", "calls"), [
    (lambda v: mpj._all_reduce(v, COMM, 2, 0), ["all_reduce", "all_reduce"]),
    (lambda v: mpj._all_reduce(v, COMM, 2, 4), ["all_reduce", "all_reduce"]),
    (lambda v: mpj._all_gather(v, COMM, 2), ["all_gather", "reduce_scatter"]),
    (lambda v: mpj._reduce_scatter(v, COMM, 2, 0), ["reduce_scatter", "all_gather"]),
    (lambda v: mpj._all_to_all(v, COMM, 2), ["all_to_all", "all_to_all"]),
], ids=["all_reduce", "all_reduce.avg", "all_gather", "reduce_scatter", "all_to_all"])
def test_each_collective_transposes_to_its_adjoint(forward: Any, calls: list[str]) -> None:
    x = jnp.ones((4, 2), jnp.float64)
    w = jnp.ones(jax.eval_shape(forward, x).shape, jnp.float64)
    assert _targets(jax.grad(lambda v: (forward(v) * w).sum()), x) == calls


@pytest.mark.parametrize("op", ["max", "min", "prod"])
def test_non_linear_reductions_have_no_gradient(op: str) -> None:
    code = mpj.REDUCTIONS[op]
    with pytest.raises(UsageError, match="has no gradient"):
        jax.make_jaxpr(jax.grad(lambda v: mpj._all_reduce(v, COMM, 2, code).sum()))(jnp.ones(3))


# --- the FFT's transposes, against jax.vjp of jnp.fft (one rank: the whole array is its piece) ---


def _interior(n: int) -> slice:
    return slice(1, (n + 1) // 2)  # what FFTPlan.hermitian_interior gives one rank holding the whole axis


@pytest.mark.parametrize("shape", [(6, 5, 4), (3, 4, 7), (8,)])
def test_c2c_transpose_matches_jnp_fft(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(1)
    x = jnp.asarray(rng.standard_normal(shape) + 1j * rng.standard_normal(shape))
    ct = jnp.asarray(rng.standard_normal(shape) + 1j * rng.standard_normal(shape))
    n = int(np.prod(shape))
    for forward, other in ((jnp.fft.fftn, lambda t: jnp.fft.ifftn(t) * n),
                           (lambda t: jnp.fft.ifftn(t) * n, jnp.fft.fftn)):
        _, vjp = jax.vjp(forward, x)
        np.testing.assert_allclose(mpj.c2c_transpose(ct, other), vjp(ct)[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(6, 5, 4), (3, 4, 7), (8,), (5,)])
def test_r2c_and_c2r_transposes_match_jnp_fft(shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(2)
    half = (*shape[:-1], shape[-1] // 2 + 1)
    axes = tuple(range(len(shape)))
    n = int(np.prod(shape))

    def r2c(t: Any) -> Any:
        return jnp.fft.rfftn(t, axes=axes)

    def c2r(t: Any) -> Any:
        return jnp.fft.irfftn(t, s=shape, axes=axes) * n

    x = jnp.asarray(rng.standard_normal(shape))
    ct = jnp.asarray(rng.standard_normal(half) + 1j * rng.standard_normal(half))
    _, vjp = jax.vjp(r2c, x)
    np.testing.assert_allclose(mpj.r2c_transpose(ct, c2r, _interior(shape[-1])), vjp(ct)[0], rtol=1e-12,
                               atol=1e-12)
    z = jnp.asarray(rng.standard_normal(half) + 1j * rng.standard_normal(half))
    ct_real = jnp.asarray(rng.standard_normal(shape))
    _, vjp = jax.vjp(c2r, z)
    np.testing.assert_allclose(mpj.c2r_transpose(ct_real, r2c, _interior(shape[-1])), vjp(ct_real)[0], rtol=1e-12,
                               atol=1e-12)


@needs_handlers
def test_fft_lowering_and_gradient_targets() -> None:
    c = (COMM, mpj.FORWARD, (4, 6), "complex64")
    back = (COMM, mpj.INVERSE, (2, 12), "complex64")
    x = jnp.ones((2, 12), jnp.complex64)
    assert jax.eval_shape(lambda v: mpj._fft(v, c, back, "c2c", (0, 0)), x).shape == (4, 6)
    text = lowered(lambda v: mpj._fft(v, c, back, "c2c", (0, 0)), x)
    assert "mpbind_fft" in text and f"plan = {COMM} : ui64" in text and "direction = -1 : i32" in text
    # the transpose of FORWARD: conj(INVERSE(conj(ct))), through the same plan, output pieces back to inputs
    def transposed(v: Any, t: Any) -> Any:
        return jax.vjp(lambda u: mpj._fft(u, c, back, "c2c", (0, 0)), v)[1](t)[0]

    jaxpr = str(jax.make_jaxpr(transposed)(x, jnp.ones((4, 6), jnp.complex64)))
    assert _targets(transposed, x, jnp.ones((4, 6), jnp.complex64)) == ["fft", "fft"]
    assert jaxpr.count("conj") >= 2


def test_r2c_gradient_needs_the_reverse_plan() -> None:
    c = (COMM, mpj.FORWARD, (4, 4), "complex64")
    no_back = (0, 0, (4, 6), "float32")
    with pytest.raises(UsageError, match="reverse="):
        jax.make_jaxpr(jax.grad(lambda v: jnp.abs(mpj._fft(v, c, no_back, "r2c", (1, 3))).sum()))(
            jnp.ones((4, 6), jnp.float32))


def test_reshape_gradient_needs_the_reverse_plan() -> None:
    with pytest.raises(UsageError, match="reverse="):
        jax.make_jaxpr(jax.grad(lambda v: mpj._reshape(v, (COMM, (2, 8), "float32"), (0, (4, 4), "float32")).sum()))(
            jnp.ones((4, 4), jnp.float32))


# --- the planned matmul ---


@needs_handlers
@pytest.mark.parametrize("with_c", [False, True], ids=["a_b", "a_b_c"])
def test_matmul_abstract_evaluation_and_lowering(with_c: bool) -> None:
    # pieces as the (c, r) JAX arrays of column-major r x c pieces: A 5 x 4, B 4 x 3, D 5 x 3
    a, b = jnp.ones((4, 5), jnp.float32), jnp.ones((3, 4), jnp.float32)
    c = jnp.ones((3, 5), jnp.float32) if with_c else None

    def fn(x: Any, y: Any) -> Any:
        return mpj._matmul(x, y, c, (COMM, (3, 5), "float32"))

    out = jax.eval_shape(fn, a, b)
    assert out.shape == (3, 5) and out.dtype == jnp.float32
    text = lowered(fn, a, b)
    assert ("@mpbind_matmul_c(" if with_c else "@mpbind_matmul(") in text
    assert f"plan = {COMM} : ui64" in text


def test_matmul_has_no_gradient_of_its_own() -> None:
    a, b = jnp.ones((4, 5), jnp.float64), jnp.ones((3, 4), jnp.float64)
    with pytest.raises(UsageError, match="planned matmul has no gradient"):
        jax.make_jaxpr(jax.grad(lambda x: mpj._matmul(x, b, None, (COMM, (3, 5), "float64")).sum()))(a)


def test_matmul_launch_checks_every_operand_before_any_library_call() -> None:
    # A rank with nothing to compute registers no plan: the launch still checks what it is given.
    launch = _core.cublasmp.launch_matmul
    mm = _core.cublasmp.launch_register_matmul(None, 0, [(True, 0, 16), (True, 0, 32), (False, 0, 0), (True, 0, 0)])
    try:
        assert launch(mm, 0, 0, [1, 2, 0, 0], [16, 32, 0, 0]) == (0, "")
        for ptrs, nbytes, message in [
            ([1, 2, 0, 0], [16, 31, 0, 0], "b must be 32 bytes on this rank, not 31"),
            ([1, 2, 5, 0], [16, 32, 8, 0], "was planned without c"),
            ([0, 2, 0, 0], [16, 32, 0, 0], "a is a NULL pointer"),
        ]:
            code, text = launch(mm, 0, 0, ptrs, nbytes)
            assert code == 1 and message in text, text
        code, text = launch(mm, 0, 1, [1, 2, 0, 0], [16, 32, 0, 0])
        assert code == 1 and "the program runs on device 1" in text
    finally:
        assert _core.cublasmp.launch_release(mm) is True
    assert _core.cublasmp.launch_release(mm) is False
    code, text = launch(mm, 0, 0, [1, 2, 0, 0], [16, 32, 0, 0])
    assert code == 1 and f"no planned matmul is registered under id {mm}" in text
    with pytest.raises(UsageError, match="one .used, offset, bytes. per operand"):
        _core.cublasmp.launch_register_matmul(None, 0, [(True, 0, 16)])
    with pytest.raises(UsageError, match="four pointers and four sizes"):
        launch(mm, 0, 0, [1, 2], [16, 32])


def test_matmul_arguments_are_checked_before_tracing() -> None:
    x = jnp.ones((4, 5), jnp.float32)
    with pytest.raises(TypeError, match="PlannedMatmul"):
        mpj.matmul(x, x, object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Communicator"):
        mpj.matmul_plan(object(), x, x, x)  # type: ignore[arg-type]


# --- refusals ---


def test_arguments_are_checked_before_tracing() -> None:
    x = jnp.ones((4,), jnp.float32)
    with pytest.raises(TypeError, match="Communicator"):
        mpj.all_reduce(x, object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="JAX array"):
        mpj.all_gather([1, 2], object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="FFTPlan"):
        mpj.fft(x, object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="ReshapePlan"):
        mpj.reshape(x, object())  # type: ignore[arg-type]


@needs_handlers
def test_a_custom_call_on_the_cpu_backend_raises() -> None:
    # Registered for CUDA only: running one on the CPU is an error, never a crash.
    with pytest.raises(Exception, match="mpbind_all_reduce"):
        jax.block_until_ready(jax.jit(lambda v: mpj._all_reduce(v, COMM, 1, 0))(jnp.ones(3)))


def test_launches_refuse_unknown_ids_before_any_library_call() -> None:
    code, text = _core.nccl.launch_collective(123456789, 0, 0, 0, 0, 16, 0, 16, 7, 0)
    assert code == 1 and "no communicator is registered under id 123456789" in text
    code, text = _core.cufftmp.launch_fft(123456789, 0, 0, 0, 16, 0, 16, -1)
    assert code == 1 and "no FFT plan is registered under id 123456789" in text
    code, text = _core.cufftmp.launch_reshape(123456789, 0, 0, 0, 16, 0, 16)
    assert code == 1 and "no reshape plan is registered under id 123456789" in text
    assert _core.nccl.launch_release(123456789) is False
    assert _core.cufftmp.launch_release(123456789) is False


def test_launch_refuses_an_unknown_collective_kind() -> None:
    code, text = _core.nccl.launch_collective(1, 9, 0, 0, 0, 16, 0, 16, 7, 0)
    assert code == 1 and "unknown collective 9" in text


# --- bootstrap over jax.distributed (two CPU processes) ---

_BOOTSTRAP = """
import sys
import jax
jax.distributed.initialize(coordinator_address="127.0.0.1:" + sys.argv[2], num_processes=2,
                           process_id=int(sys.argv[1]))
import mpbind.jax as mpj
from mpbind import bootstrap
group = mpj.process_group(timeout=60)
uid = bootstrap.share_unique_id("nccl", group)
print("uid", bytes(uid).hex(), group.rank, group.nranks, group.allgather_bytes(b"r%d" % group.rank), flush=True)
"""


def test_unique_id_shared_over_jax_distributed(tmp_path: Any) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    script = tmp_path / "bootstrap.py"
    script.write_text(_BOOTSTRAP)
    procs = [subprocess.Popen([sys.executable, str(script), str(k), port], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for k in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    lines = []
    for p, (out, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-2000:]
        lines.append(next(line for line in out.splitlines() if line.startswith("uid")).split())
    assert lines[0][1] == lines[1][1] and len(lines[0][1]) == 256  # one 128-byte NCCL unique id on both
    assert [line[2:4] for line in lines] == [["0", "2"], ["1", "2"]]
    assert lines[0][4:] == lines[1][4:] == ["[b'r0',", "b'r1']"]


def test_process_group_needs_jax_distributed() -> None:
    with pytest.raises(UsageError, match="jax.distributed.initialize"):
        mpj.process_group()
