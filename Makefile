# Two commands for a fresh machine: `make demo` runs the main job, `make test` runs the tests.
# Both create (or reuse) the virtual environment .venv and install what they need into it.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.aiayn-installed

.PHONY: demo test install clean

demo: $(STAMP)
	$(BIN)/aiayn demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,marian]'
	touch $(STAMP)

clean:
	rm -rf $(VENV) build *.egg-info
