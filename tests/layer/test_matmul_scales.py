"""FP8 scales given to one call of a planned matmul (``PlannedMatmul.execute(scales=)``), without a GPU:
the plan is built from doubles of the layer's cuBLASMp objects that record what it asks of them, and
the descriptor's pointers are seen as the matmul sees them when it is enqueued. Checked: the call's
scales are validated as at planning (names exactly the planned ones, types, element counts, device,
amax_d writable), the descriptor points at them for that call alone and at the planned ones again
after it (also when the call fails), two threads never interleave a call's repointing and launch, and
plans without scales or captured plans refuse them."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from mpbind import cublasmp
from mpbind import distributions as dist
from mpbind import matmul as pm
from mpbind.errors import UsageError
from mpbind.matmul._planner import MatmulPlan, plan

sys.path.insert(0, str(Path(__file__).parents[1] / "core"))
from dlpack_objects import InterfaceArray  # noqa: E402

# The descriptor attribute each scale's pointer is, by the layer's name of it.
ATTRIBUTE = {"a": "a_scale_pointer", "b": "b_scale_pointer", "d": "d_scale_pointer", "amax_d": "amax_d_pointer"}


def scalar(ptr: int, readonly: bool = False) -> InterfaceArray:
    return InterfaceArray((1,), "<f4", ptr=ptr, readonly=readonly)


class Doubles:
    """The layer's cuBLASMp objects as doubles: the matmul descriptor's attributes are a dict, and each
    execute records the pointers the descriptor holds at that moment."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.descriptor: dict[str, Any] = {}
        self.log: list[tuple[str, Any]] = []  # ("repoint", pointers) and ("execute", the scale pointers then)
        self.captured = False
        self.fail_execute = False
        self.in_execute = threading.Event()
        self.release = threading.Event()
        self.release.set()
        doubles = self

        class Closing:
            closed = False
            serial = 1

            def close(self) -> None:
                self.closed = True

        class Matrix(Closing):
            def __init__(self, grid: Any, local: Any, shape: Any, block: Any, src: Any) -> None:
                self.grid = grid
                self.ptr = 0x1000
                self.descriptor = Closing()

            def operand(self) -> tuple[Any, ...]:
                return (self, 1, 1)

        class Descriptor(Closing):
            def __init__(self, compute: Any, **attributes: Any) -> None:
                object.__setattr__(self, "attributes", doubles.descriptor)
                object.__setattr__(self, "_core", self)
                self.attributes.update(attributes)

            def __setattr__(self, name: str, value: Any) -> None:
                self.attributes[name] = value

        class Plan(Closing):
            def __init__(self, *args: Any) -> None:
                pass

            @property
            def captured(self) -> bool:
                return doubles.captured

            def execute(self, stream: Any = None, **arrays: Any) -> None:
                doubles.log.append(("execute", doubles.scale_pointers()))
                doubles.in_execute.set()
                assert doubles.release.wait(10)
                if doubles.fail_execute:
                    raise RuntimeError("the library refused")

        def repoint(descriptor: Any, pointers: dict[str, int]) -> None:
            doubles.log.append(("repoint", dict(pointers)))
            for name, ptr in pointers.items():
                descriptor.attributes[ATTRIBUTE[name]] = ptr

        monkeypatch.setattr(cublasmp, "grid", lambda comm, nprow, npcol, layout: (nprow, npcol))
        monkeypatch.setattr(cublasmp, "Matrix", Matrix)
        monkeypatch.setattr(cublasmp, "MatmulDescriptor", Descriptor)
        monkeypatch.setattr(cublasmp, "Handle", lambda stream: Closing())
        from mpbind import _core

        monkeypatch.setattr(_core.cublasmp, "MatmulPlan", Plan)
        monkeypatch.setattr(pm, "_repoint", repoint)

    def scale_pointers(self) -> dict[str, int]:
        return {name: self.descriptor[attr] for name, attr in ATTRIBUTE.items() if attr in self.descriptor}


class FakeComm:
    def __init__(self, rank: int, size: int, device: int = 0) -> None:
        self.rank, self.size, self.device = rank, size, device


def fp8_plan(d_dtype: str = "bfloat16", scales: tuple[str, ...] = ("a", "b"), scaling: str | None = None) -> MatmulPlan:
    """AllGather+GEMM of FP8 A (TN) and B over 2 ranks: A 32 x 64 and B 32 x 32 by columns, D 64 x 32 by rows."""
    return plan(a=dist.by_columns((32, 64), 2), b=dist.by_columns((32, 32), 2), d=dist.by_rows((64, 32), 2),
                a_dtype="float8_e4m3fn", d_dtype=d_dtype, transa=True, scales=scales, scaling=scaling)


def build(p: MatmulPlan, scales: dict[str, Any], rank: int = 1, device: int = 0) -> Any:
    rows, cols = p.d.local_shape(rank)
    arrays = {"a": np.zeros(p.a.local_shape(rank)), "b": np.zeros(p.b.local_shape(rank)), "c": None,
              "d": np.zeros((rows, cols))}
    return pm.PlannedMatmul._build(FakeComm(rank, p.nranks, device), p, arrays, None, None,  # type: ignore[arg-type]
                                   scales, None, None, None, None)


PLANNED = {"a": 0x5000, "b": 0x5100, "d": 0x5200, "amax_d": 0x5300}
GIVEN = {"a": 0x6000, "b": 0x6100, "d": 0x6200, "amax_d": 0x6300}


@pytest.fixture
def doubles(monkeypatch: pytest.MonkeyPatch) -> Doubles:
    return Doubles(monkeypatch)


@pytest.fixture
def fp8_out(doubles: Doubles) -> Any:
    """A plan with FP8 D: scales a, b, d and amax_d."""
    names = ("a", "b", "d", "amax_d")
    return build(fp8_plan("float8_e4m3fn", names), {name: scalar(PLANNED[name]) for name in names})


def test_a_call_runs_with_its_scales_and_the_plan_keeps_its_own(doubles: Doubles, fp8_out: Any) -> None:
    assert doubles.scale_pointers() == PLANNED
    assert fp8_out.scale_pieces() == {name: (1, ("float32",)) for name in PLANNED}
    fp8_out.execute(scales={name: scalar(GIVEN[name]) for name in GIVEN})
    assert doubles.log == [("repoint", GIVEN), ("execute", GIVEN), ("repoint", PLANNED)]
    assert doubles.scale_pointers() == PLANNED
    doubles.log.clear()
    fp8_out.execute()  # the planned ones
    assert doubles.log == [("execute", PLANNED)]
    doubles.log.clear()
    # only what differs from the plan is repointed (and restored)
    fp8_out.execute(scales={**{name: scalar(PLANNED[name]) for name in PLANNED}, "b": scalar(0x7000)})
    assert doubles.log == [("repoint", {"b": 0x7000}), ("execute", {**PLANNED, "b": 0x7000}),
                           ("repoint", {"b": PLANNED["b"]})]
    doubles.log.clear()
    fp8_out.execute(scales={name: scalar(PLANNED[name]) for name in PLANNED})
    assert doubles.log == [("execute", PLANNED)]


def test_the_planned_scales_come_back_when_the_call_fails(doubles: Doubles, fp8_out: Any) -> None:
    doubles.fail_execute = True
    with pytest.raises(RuntimeError, match="the library refused"):
        fp8_out.execute(scales={name: scalar(GIVEN[name]) for name in GIVEN})
    assert doubles.scale_pointers() == PLANNED
    assert doubles.log[-1] == ("repoint", PLANNED)


@pytest.mark.parametrize(("scales", "error", "match"), [
    ({"a": 0x6000, "b": 0x6100, "d": 0x6200}, UsageError,
     r"scales must name exactly the planned ones \('a', 'b', 'd', 'amax_d'\); given: 'a', 'b', 'd'"),
    ({**GIVEN, "c": 0x6400}, UsageError, r"given: 'a', 'amax_d', 'b', 'c', 'd'"),
    ({}, UsageError, r"planned ones \('a', 'b', 'd', 'amax_d'\); given: none"),
    ({**GIVEN, "a": InterfaceArray((1,), "<f2", ptr=0x6000)}, UsageError,
     r"scales\['a'\] must be 1 contiguous float32 on device 0; got 1 float16"),
    ({**GIVEN, "d": InterfaceArray((2,), "<f4", ptr=0x6200)}, UsageError,
     r"scales\['d'\] must be 1 contiguous float32 on device 0; got 2 float32"),
    ({**GIVEN, "b": np.ones(1, np.float32)}, UsageError, r"scales\['b'\] must be in GPU memory"),
    ({**GIVEN, "amax_d": scalar(0x6300, readonly=True)}, UsageError, r"scales\['amax_d'\] is read-only"),
    ({**GIVEN, "a": None}, UsageError, r"scales\['a'\] is required"),
])
def test_a_calls_scales_are_checked_as_at_planning(doubles: Doubles, fp8_out: Any, scales: dict[str, Any],
                                                    error: type[Exception], match: str) -> None:
    given = {name: scalar(v) if isinstance(v, int) else v for name, v in scales.items()}
    with pytest.raises(error, match=match):
        fp8_out.execute(scales=given)
    assert doubles.log == [] and doubles.scale_pointers() == PLANNED  # refused before anything


def test_scales_not_a_mapping_are_refused(doubles: Doubles, fp8_out: Any) -> None:
    with pytest.raises(TypeError, match="scales must be a mapping of name -> array, not list"):
        fp8_out.execute(scales=[scalar(1)])


def test_scales_on_another_device_are_refused(doubles: Doubles) -> None:
    p = fp8_plan()
    made = build(p, {"a": scalar(PLANNED["a"]), "b": scalar(PLANNED["b"])}, device=1)  # the arrays say device 0
    with pytest.raises(UsageError, match=r"scales\['a'\] must be 1 contiguous float32 on device 1; got 1 float32 on "
                                         r"device 0"):
        made.execute(scales={"a": scalar(GIVEN["a"]), "b": scalar(GIVEN["b"])})


def test_a_plan_without_scales_refuses_any(doubles: Doubles) -> None:
    p = plan(a=dist.by_columns((32, 64), 2), b=dist.by_columns((32, 32), 2), d=dist.by_rows((64, 32), 2),
             a_dtype="bfloat16", transa=True)
    made = build(p, {})
    assert made.scale_pieces() == {}
    with pytest.raises(UsageError, match=r"the matmul \(allgather_gemm 64 x 32 x 32\) was planned without scales, so "
                                         r"a call takes none; given: 'a', 'b'"):
        made.execute(scales={"a": scalar(1), "b": scalar(2)})
    made.execute(scales={})  # none given: a plain call
    assert doubles.log == [("execute", {})]


def test_a_captured_plan_refuses_scales_of_a_call(doubles: Doubles, fp8_out: Any) -> None:
    doubles.captured = True
    with pytest.raises(UsageError, match="a captured matmul replays the scales it recorded"):
        fp8_out.execute(scales={name: scalar(GIVEN[name]) for name in GIVEN})
    fp8_out.execute()  # the replay itself
    assert doubles.log == [("execute", PLANNED)]


def test_a_closed_plan_refuses_scales(doubles: Doubles, fp8_out: Any) -> None:
    fp8_out.close()
    with pytest.raises(UsageError, match="PlannedMatmul is closed"):
        fp8_out.execute(scales={name: scalar(GIVEN[name]) for name in GIVEN})


def test_block_scales_are_counted_for_this_ranks_piece(doubles: Doubles) -> None:
    # MXFP8: one scale per 32 elements along K, in 128 x 4 tiles; A's piece is 128 x 128 (k x m)
    p = plan(a=dist.by_columns((128, 256), 2), b=dist.by_columns((128, 256), 2), d=dist.by_rows((256, 256), 2),
             a_dtype="float8_e4m3fn", transa=True, scales=("a", "b"), scaling="mxfp8")
    count = 128 * 4
    made = build(p, {"a": InterfaceArray((count,), "|u1", ptr=0x5000), "b": InterfaceArray((count,), "|u1",
                                                                                           ptr=0x5100)})
    assert made.scale_pieces() == {"a": (count, ("float8_e8m0fnu", "uint8")), "b": (count, ("float8_e8m0fnu", "uint8"))}
    with pytest.raises(UsageError, match=rf"scales\['b'\] must be {count} contiguous float8_e8m0fnu or uint8 on "
                                         r"device 0; got 1 float32"):
        made.execute(scales={"a": InterfaceArray((count,), "|u1", ptr=0x6000), "b": scalar(0x6100)})
    made.execute(scales={"a": InterfaceArray((count,), "|u1", ptr=0x6000), "b": InterfaceArray((count,), "|u1",
                                                                                               ptr=0x6100)})
    assert doubles.log[1] == ("execute", {"a": 0x6000, "b": 0x6100})
    assert doubles.scale_pointers() == {"a": 0x5000, "b": 0x5100}


def test_two_threads_never_interleave_repointing_and_launch(doubles: Doubles, fp8_out: Any) -> None:
    other = {name: ptr + 0x1000 for name, ptr in GIVEN.items()}
    doubles.release.clear()
    errors: list[BaseException] = []

    def call(pointers: dict[str, int]) -> None:
        try:
            fp8_out.execute(scales={name: scalar(pointers[name]) for name in pointers})
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    first = threading.Thread(target=call, args=(GIVEN,))
    first.start()
    assert doubles.in_execute.wait(10)  # the first call is in the library, its scales in the descriptor
    second = threading.Thread(target=call, args=(other,))
    second.start()
    second.join(0.2)
    assert second.is_alive()  # waiting for the first call's launch and restore
    plain = threading.Thread(target=fp8_out.execute)
    plain.start()
    plain.join(0.2)
    assert plain.is_alive()  # a call with the planned scales waits too
    assert doubles.log == [("repoint", GIVEN), ("execute", GIVEN)]
    doubles.release.set()
    for t in (first, second, plain):
        t.join(10)
    assert not errors
    # each call's launch saw its own scales, between its repointing and its restore
    first_three = doubles.log[:3]
    assert first_three == [("repoint", GIVEN), ("execute", GIVEN), ("repoint", PLANNED)]
    rest = doubles.log[3:]
    runs = [rest[:3], rest[3:]] if rest[0][0] == "repoint" else [rest[1:], rest[:1]]
    assert [("repoint", other), ("execute", other), ("repoint", PLANNED)] in runs
    assert [("execute", PLANNED)] in runs
    assert doubles.scale_pointers() == PLANNED


def test_repoint_sets_each_pointer_through_the_library(monkeypatch: pytest.MonkeyPatch) -> None:
    from mpbind.bindings import cublasmp as flat

    seen: list[tuple[Any, int, int]] = []
    monkeypatch.setattr(flat, "matmul_descriptor_set", lambda desc, attr, value: seen.append((desc, attr, value)))

    class Descriptor:  # the layer's descriptor attributes, on a descriptor of address 0xD00
        ptr = 0xD00
        a_scale_pointer = cublasmp.MatmulDescriptor.a_scale_pointer
        amax_d_pointer = cublasmp.MatmulDescriptor.amax_d_pointer

    pm._repoint(Descriptor(), {"a": 0x10, "amax_d": 0x20})  # type: ignore[arg-type]
    A = flat.MatmulDescriptorAttribute
    assert seen == [(0xD00, A.A_SCALE_POINTER, 0x10), (0xD00, A.AMAX_D_POINTER, 0x20)]
