"""Misuse of the flat NCCL bindings: mypy --strict must reject each marked line with that error code."""

from mpbind.bindings import nccl

rank = nccl.comm_count("not a communicator")  # error: arg-type
comm: nccl.Comm = 5  # error: assignment
text: int = nccl.get_error_string(nccl.Result.SUCCESS)  # error: assignment
config = nccl.Config(blocking="yes")  # error: arg-type
uid: bytes = nccl.get_unique_id()  # error: assignment
dtype: nccl.DataType = nccl.Result.SUCCESS  # error: assignment
