"""Generated flat bindings, one module per library (``mpbind.bindings.nccl``, ...).

Each module covers the host C API of a pinned header version. Import the module
you need explicitly; this package imports nothing by itself. ``cy<lib>.pxd``
files expose the C-level entry points to other Cython code.
"""
