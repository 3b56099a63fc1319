"""How each C function looks from Python: its parameters' roles, arranged into a Python
signature and result. Shared by the .pyx and .pyi emitters."""

from __future__ import annotations

from dataclasses import dataclass

from ir_types import Function, Library, is_void
from pyvalues import py_type
from roles import PyParam, Role, bind


@dataclass
class Plan:
    f: Function
    roles: list[Role]  # one per C parameter, in C order
    params: list[PyParam]  # the Python parameters, in C order
    returns: list[str]  # stub types: the C return value (unless a status), then each output

    @property
    def return_type(self) -> str:
        if not self.returns:
            return "None"
        if len(self.returns) == 1:
            return self.returns[0]
        return "tuple[" + ", ".join(self.returns) + "]"


def plan(lib: Library, f: Function) -> Plan:
    roles = [bind(lib, f, p) for p in f.params]
    params = [pp for r in roles if (pp := r.python_param()) is not None]
    returns = [] if f.returns_status or is_void(f.returns) else [py_type(lib, f.returns, out=True)]
    returns += [t for r in roles if (t := r.returns()) is not None]
    # Trailing nullable parameters default to None.
    for pp in reversed(params):
        if not pp.role.p.nullable:
            break
        pp.default = "None"
    return Plan(f, roles, params, returns)
