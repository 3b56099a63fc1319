# mpbind developer entry points. `make demo` and `make test` are all a fresh
# machine (Python >= 3.10 with venv, access to PyPI) needs.

PYTHON ?= python3
VENV   ?= .venv
VPY    := $(VENV)/bin/python
EXTRAS ?= cu13,test

.DEFAULT_GOAL := test
.PHONY: demo test install lint clean

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
	touch $@

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

lint: $(VPY)
	$(VPY) -m ruff check src/mpbind codegen tests benchmarks examples

clean:
	rm -rf build dist .mypy_cache .ruff_cache .pytest_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
