"""Misuse of the flat cuFFTMp bindings: mypy --strict must reject each marked line with that error code."""

from mpbind.bindings import cufftmp

plan = cufftmp.plan3d(8, 8, "8", cufftmp.Type.C2C)  # error: arg-type
version: str = cufftmp.get_version()  # error: assignment
kind: cufftmp.Type = cufftmp.Result.SUCCESS  # error: assignment
cufftmp.xt_set_distribution(0, 3, 0, [4, 4, 4], [0, 0, 0], [4, 4, 4])  # error: arg-type
desc = cufftmp.XtDesc(gpus=[0])  # error: call-arg
reshape: cufftmp.ReshapeHandle = 5  # error: assignment
data: list[int] = cufftmp.XtDesc().data  # error: assignment
