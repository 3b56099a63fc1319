"""The core's registry, teardown queue and cache, driven through library-free doubles
(mpbind._core._testing), including 16 threads at once; and what the Pythonic layer decides
before any library call."""

from __future__ import annotations

import gc
import random
import subprocess
import sys
import threading
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mpbind import _core
from mpbind._infra import interop as _interop
from mpbind.errors import MpbindError, UsageError

sys.path.insert(0, str(Path(__file__).parent))
from dlpack_objects import STREAMS  # noqa: E402

T = _core._testing
THREADS = 16


def _run_threads(fn: Any, n: int = THREADS) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(n)

    def body(i: int) -> None:
        try:
            barrier.wait()
            fn(i)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert not errors, errors


class Calls:
    """The 'library' of the doubles: counts registrations and deregistrations per pointer."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reg: Counter[int] = Counter()
        self.dereg: Counter[int] = Counter()

    def on_register(self, ptr: int, size: int) -> None:
        with self.lock:
            self.reg[ptr] += 1

    def on_deregister(self, ptr: int, size: int) -> None:
        with self.lock:
            self.dereg[ptr] += 1


# --- registry --------------------------------------------------------------------------------


def test_registration_is_refcounted() -> None:
    calls = Calls()
    owner = T.Owner(on_register=calls.on_register, on_deregister=calls.on_deregister)
    keep = object()
    r1 = owner.register(0x1000, 64, keep)
    r2 = owner.register(0x1000, 64)
    assert calls.reg[0x1000] == 1  # the second registration made no library call
    assert r1.references == r2.references == 2
    assert r2.buffer is keep  # the registration keeps its buffer alive
    other = owner.register(0x1000, 128)  # another size is another registration
    assert calls.reg[0x1000] == 2
    r1.close()
    r1.close()  # idempotent: drops one reference once
    assert calls.dereg[0x1000] == 0 and r2.references == 1
    r2.close()
    assert calls.dereg[0x1000] == 1
    with pytest.raises(UsageError, match="closed"):
        _ = r2.ptr
    mine = [r for r in _core.registrations() if r["ptr"] == 0x1000]
    assert [r["size"] for r in mine] == [128]
    owner.close()  # the owner deregisters what is left, first
    assert calls.dereg[0x1000] == 2 and other.closed
    with pytest.raises(UsageError, match="closed"):
        owner.register(0x1000, 64)


def test_registration_dropped_without_close() -> None:
    calls = Calls()
    local = T.Owner(on_register=calls.on_register, on_deregister=calls.on_deregister)
    r = local.register(0x2000, 8)
    del r
    gc.collect()
    assert calls.dereg[0x2000] == 1  # a local deregistration may run from the garbage collector
    coll = T.Owner(collective=True, on_register=calls.on_register, on_deregister=calls.on_deregister)
    r = coll.register(0x3000, 8)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        del r
        gc.collect()
    assert calls.dereg[0x3000] == 0  # collective: never from the garbage collector
    assert any(issubclass(w.category, ResourceWarning) for w in seen)
    assert any(kind == "testing.CollectiveRegistration" for kind, _ in _core.queued())
    coll.close()  # the owner's close drains what is queued under it
    assert calls.dereg[0x3000] == 1
    assert not any(kind == "testing.CollectiveRegistration" for kind, _ in _core.queued())


def test_registry_under_16_threads() -> None:
    calls = Calls()
    owner = T.Owner(on_register=calls.on_register, on_deregister=calls.on_deregister)
    ptrs = [0x10000 + 0x100 * i for i in range(4)]
    held: list[Any] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        rng = random.Random(i)
        mine = []
        for _ in range(200):
            mine.append(owner.register(rng.choice(ptrs), 256))
            if len(mine) > 5:
                mine.pop(rng.randrange(len(mine))).close()
        with lock:
            held.extend(mine)

    _run_threads(work)
    live = {r["ptr"]: r["references"] for r in owner.registrations()}
    assert sum(live.values()) == len(held)
    for p in ptrs:
        # Every library registration was undone except the live one; never two at once.
        assert calls.reg[p] - calls.dereg[p] == (1 if p in live else 0)
    for r in held:
        r.close()
    assert not owner.registrations()
    assert calls.reg == calls.dereg
    owner.close()


# --- teardown queue --------------------------------------------------------------------------


def test_queue_runs_newest_first_whatever_the_drop_order() -> None:
    released: list[int] = []
    owner = T.Owner(collective=True)
    items = [owner.add(True, released.append) for _ in range(6)]
    serials = [i.serial for i in items]
    order = list(range(6))
    random.Random(7).shuffle(order)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        for i in order:
            items[i] = None
        gc.collect()
    assert [s for _, s in _core.queued() if s in serials] == sorted(serials, reverse=True)
    assert _core.drain() >= 6
    assert released == sorted(serials, reverse=True)  # the same order on every rank
    assert not _core.queued()
    owner.close()


def test_close_releases_children_first_and_once() -> None:
    released: list[int] = []
    owner = T.Owner()
    a = owner.add(False, released.append)
    b = owner.add(True, released.append)
    a.close()
    owner.close()
    owner.close()
    assert released == [a.serial, b.serial]  # a once, then b with its owner
    assert b.closed


def test_queue_under_16_threads() -> None:
    released: list[int] = []
    lock = threading.Lock()

    def on_release(serial: int) -> None:
        with lock:
            released.append(serial)

    owner = T.Owner(collective=True)
    made: list[int] = []

    def work(i: int) -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            for _ in range(50):
                r = owner.add(True, on_release)
                with lock:
                    made.append(r.serial)
                del r

    _run_threads(work)
    gc.collect()
    assert _core.drain() == len(made)
    assert released == sorted(made, reverse=True)
    owner.close()


def test_resource_and_lifetime_protocol() -> None:
    released: list[int] = []
    with T.Resource(False, released.append) as r:
        assert not r.closed
    assert r.closed and released == [r.serial]
    r.close()
    assert released == [r.serial]


# --- cache -----------------------------------------------------------------------------------


def test_cache_hits_and_concurrent_misses() -> None:
    T.cache_clear()
    base = T.cache_info()
    got: list[int] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        for key in range(8):
            s = T.cached(key).serial
            with lock:
                got.append((key, s))  # type: ignore[arg-type]

    _run_threads(work)
    info = T.cache_info()
    per_key: dict[int, set[int]] = {}
    for key, s in got:  # type: ignore[misc]
        per_key.setdefault(key, set()).add(s)
    assert all(len(v) == 1 for v in per_key.values())  # one object per key, however many threads
    assert info["misses"] - base["misses"] == 8
    assert info["hits"] - base["hits"] == THREADS * 8 - 8
    assert info["entries"] == 8
    one = T.cached(3)
    one.close()
    assert T.cached(3).serial != one.serial  # a closed entry is replaced
    T.cache_clear()
    assert T.cache_info()["entries"] == 0


# --- exit with live objects --------------------------------------------------------------------


def test_exit_with_live_and_queued_objects_is_clean() -> None:
    code = (
        "import warnings\n"
        "from mpbind import _core\n"
        "o = _core._testing.Owner(collective=True, on_deregister=lambda p, s: print('ran at exit'))\n"
        "r = o.register(1, 2)\n"
        "k = o.add(True)\n"
        "with warnings.catch_warnings():\n"
        "    warnings.simplefilter('ignore')\n"
        "    lost = o.add(True)\n"
        "    del lost\n"
        "print('bye')\n"
    )
    p = _exit_of(code)
    assert p.stdout.strip() == "bye"  # nothing collective ran at exit
    assert "1 collective release(s) still queued at exit were skipped" in p.stderr
    # What is still referenced: one line per kind, with its serials (the owner releases nothing).
    lines = [line for line in p.stderr.splitlines() if "still open at exit" in line]
    assert lines == [
        "mpbind: 1 testing.CollectiveRegistration still open at exit (serial 2), not released: nothing "
        "collective runs at exit",
        "mpbind: 1 testing.CollectiveResource still open at exit (serial 3), not released: nothing collective "
        "runs at exit",
    ], p.stderr
    assert "Traceback" not in p.stderr


def test_exit_report_counts_each_kind_once() -> None:
    code = (
        "from mpbind import _core\n"
        "o = _core._testing.Owner()\n"
        "kept = [o.add(False) for _ in range(12)]\n"
        "freed = o.add(False); freed.close()\n"
    )
    assert _exit_of(code).stderr.splitlines() == [
        "mpbind: 12 testing.Resource still open at exit (serials 2, 3, 4, 5, 6, 7, 8, 9, ...), not released: "
        "nothing collective runs at exit"]


def _exit_of(code: str) -> subprocess.CompletedProcess[str]:
    """`code` run in a fresh interpreter, which exits cleanly."""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p


# --- interop -----------------------------------------------------------------------------------


class FakeDeviceArray:
    """An input, not a library: any object with __cuda_array_interface__ is an array to us."""

    def __init__(self, shape: tuple[int, ...], typestr: str = "<f4", strides: tuple[int, ...] | None = None,
                 ptr: int = 0x7F0000000000, readonly: bool = False) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, readonly),
                                         "strides": strides, "version": 3}


def test_array_info_from_the_interface_and_dlpack() -> None:
    info = _interop.array_info(FakeDeviceArray((4, 3)))
    assert (info.shape, info.strides, info.dtype, info.nbytes, info.c_contiguous) == ((4, 3), (3, 1), "float32",
                                                                                        48, True)
    t = _interop.array_info(FakeDeviceArray((4, 3), strides=(4, 16)))
    assert t.strides == (1, 4) and t.f_contiguous and not t.c_contiguous
    host = _interop.array_info(np.zeros((2, 5), np.float64)[:, ::2])  # DLPack (NumPy is host memory)
    assert host.device == -1 and host.strides == (5, 2) and host.dtype == "float64"
    with pytest.raises(UsageError, match="GPU memory"):
        _interop.device_array(np.zeros(3), "x")
    with pytest.raises(UsageError, match="C-contiguous"):
        _interop.device_array(FakeDeviceArray((4, 3), strides=(4, 16)), "x")
    with pytest.raises(UsageError, match="read-only"):
        _interop.device_array(FakeDeviceArray((4,), readonly=True), "x", writable=True)
    with pytest.raises(TypeError, match="__cuda_array_interface__"):
        _interop.array_info(object())
    with pytest.raises(UsageError, match="itemsize"):
        _interop.array_info(FakeDeviceArray((4,), strides=(3,)))


def test_dtype_names() -> None:
    assert _interop.dtype_name("torch.bfloat16") == "bfloat16"
    assert _interop.dtype_name(np.complex64) == "complex64"
    assert _interop.dtype_name("half") == "float16"
    assert _interop.itemsize("float8_e4m3fn") == 1
    with pytest.raises(UsageError, match="unsupported dtype"):
        _interop.dtype_name("float128")


def test_dtype_names_are_interned() -> None:
    # A SymmetricArray keeps its dtype's name; interned, the hot calls find it by identity.
    a, b = _interop.dtype_name(np.float32), _interop.dtype_name("".join(["float", "32"]))
    assert a == b == "float32" and a is b


def test_streams() -> None:
    a, b, c, d = STREAMS[:4]  # readable memory: what a raw handle must point at

    class Protocol:
        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, a)

    class TorchLike:
        cuda_stream = b

    class CupyLike:
        ptr = c

    assert _interop.stream_handle(None) == 0
    assert _interop.stream_handle(d) == d
    assert _interop.stream_handle(Protocol()) == a
    assert _interop.stream_handle(TorchLike()) == b
    assert _interop.stream_handle(CupyLike()) == c
    with pytest.raises(TypeError, match="stream"):
        _interop.stream_handle("default")


def test_device_span() -> None:
    assert _interop.device_span((0x10, 64))[:2] == (0x10, 64)
    arr = FakeDeviceArray((8,), typestr="<f8")
    assert _interop.device_span(arr)[:2] == (0x7F0000000000, 64)
    with pytest.raises(TypeError, match="ptr"):
        _interop.device_span((1, 2, 3))


# --- what the layer decides before a library call ------------------------------------------------


def test_nccl_layer_validation() -> None:
    from mpbind import nccl

    with pytest.raises(UsageError, match="nranks"):
        nccl.Communicator.init(0, 0, bytes(128))
    with pytest.raises(UsageError, match="rank must be in"):
        nccl.Communicator.init(2, 2, bytes(128))
    with pytest.raises(UsageError, match="128 bytes"):
        nccl.Communicator.init(1, 0, b"short")
    with pytest.raises(TypeError, match="Config"):
        nccl.Communicator.init(1, 0, bytes(128), config=object())  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="nbytes"):
        nccl.mem_alloc(0)
    with pytest.raises(TypeError, match="init\\(\\)"):
        nccl.Communicator(object())


def test_nccl_layer_without_gpu_raises_typed_errors() -> None:
    from mpbind import nccl

    try:
        comm = nccl.Communicator.init(1, 0, nccl.get_unique_id())
    except MpbindError as exc:
        assert type(exc).__name__.startswith("NCCL"), exc
    else:  # a GPU is present: the call worked
        comm.close()
        pytest.skip("a GPU is present")


def test_cublasmp_layer_without_gpu_raises_typed_errors() -> None:
    from mpbind import cublasmp

    try:
        h = cublasmp.Handle(None)
    except MpbindError as exc:
        assert "cuBLASMp" in str(exc) or "cublasmp" in str(exc).lower() or "libcuda" in str(exc), exc
    else:
        h.close()
        pytest.skip("a GPU is present")
    with pytest.raises(TypeError, match="Communicator"):
        cublasmp.grid(object(), 1, 1)
