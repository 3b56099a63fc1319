"""Parameter roles (codegen/roles.py): one class per role, and a new role is a change to that file only."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

Generator = Callable[[str], ModuleType]

# A role that passes an int through a local of its own, so that its rendering is easy to find.
DUMMY_ROLE = '''

@role("dummy")
class Dummy(Input):
    """A role added by the generator's tests."""

    def stub_type(self) -> str:
        return "DummyValue"

    def convert(self) -> list[str]:
        return [f"cdef intptr_t _dummy_{self.n} = {self.py}  # rendered by the dummy role"]

    def arg(self) -> str:
        return f"<{cy_type(self.p.type, drop_const=True)}>_dummy_{self.n}"
'''

# ncclMemAlloc(void** ptr, size_t size): `size` is a plain input without a spec entry.
DUMMY_SPEC = '''
[functions.ncclMemAlloc.params]
size = { role = "dummy" }
'''


def test_a_new_role_is_one_class_in_roles_py(tree_copy: Path) -> None:
    codegen = tree_copy / "codegen"
    with (codegen / "roles.py").open("a") as f:
        f.write(DUMMY_ROLE)
    with (codegen / "specs" / "nccl.toml").open("a") as f:
        f.write(DUMMY_SPEC)
    proc = subprocess.run([sys.executable, str(codegen / "generate.py"), "--lib", "nccl"], cwd=tree_copy,
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and "not installed" in proc.stderr:
        pytest.skip(f"the pinned NCCL headers cannot be parsed here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pyx = (tree_copy / "src" / "mpbind" / "bindings" / "nccl.pyx").read_text()
    function = pyx[pyx.index("\ndef mem_alloc("):]
    function = function[: function.index("\n\n\n")]
    assert "def mem_alloc(size):" in function
    assert "cdef intptr_t _dummy_size = size  # rendered by the dummy role" in function
    assert "ncclMemAlloc(&_r_ptr, <size_t>_dummy_size)" in function
    pyi = (tree_copy / "src" / "mpbind" / "bindings" / "nccl.pyi").read_text()
    assert "def mem_alloc(size: DummyValue) -> int:\n    \"\"\"Binds ncclMemAlloc." in pyi
    ir = (codegen / "ir" / "nccl.json").read_text()
    assert '"role": "dummy"' in ir


def test_an_unknown_role_is_refused(generator: Generator) -> None:
    roles = generator("roles")
    with pytest.raises(ValueError, match="unknown role no_such_role"):
        roles.check("no_such_role", {}, "ncclMemAlloc.size")


def test_a_role_missing_an_attribute_it_requires_is_refused(generator: Generator) -> None:
    roles = generator("roles")
    with pytest.raises(ValueError, match="role out_bytes needs capacity, length_out"):
        roles.check("out_bytes", {}, "f.buf")
    roles.check("out_bytes", {"capacity": "n", "length_out": "len"}, "f.buf")


def test_every_bound_parameter_has_a_role_class(generate: ModuleType, generator: Generator) -> None:
    roles = generator("roles")
    for name in generate.LIBRARIES:
        lib = generate.load_library(name)
        for f in lib.bound:
            for p in f.params:
                assert isinstance(roles.bind(lib, f, p), roles.Role)


def test_emitters_do_not_branch_on_role_names(generator: Generator) -> None:
    # The emitters arrange what roles render; a role's name is read only in roles.py and model.py.
    bindings = Path(generator("roles").__file__).parent
    for module in ("emit_python", "emit_stubs", "plan"):
        tree = ast.parse((bindings / f"{module}.py").read_text())
        names = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
        assert not names & generator("roles").names(), f"{module}.py names a role"
