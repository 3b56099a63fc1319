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

# Non-editable install: tests and the demo use the installed package, not src/.
install: $(VPY)
	$(VPY) -m pip install ".[$(EXTRAS)]"

demo: install
	$(VPY) -m mpbind info
	$(VPY) examples/demo.py

test: install
	$(VPY) bindings/generate.py --check
	$(VPY) -m pytest tests -m "not gpu"

lint: $(VPY)
	$(VPY) -m ruff check src/mpbind bindings tests benchmarks examples

clean:
	rm -rf build dist .mypy_cache .ruff_cache .pytest_cache
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +
