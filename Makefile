# tensorwire: every target sets up .venv on first use, so a fresh clone needs only `make demo`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-torch test test-pythons test-floors test-gpu gpu-bundle bench lint proto fuzz soak chaos rdma clean bytecode

# NIXL for the `nixl` transport. --no-deps: the wheel declares torch, which host memory does not
# need. Pinned to the version the transport is tested with.
NIXL := nixl-cu12==1.5.1
RDMA_STAMP := $(VENV)/.rdma-installed
# cupy for the GPU code paths: on a machine without a GPU the tests check that they fail cleanly
# and that host paths never import it; `make test-gpu` runs the GPU tests where there is one.
CUPY := cupy-cuda12x==14.2.0
GPU_STAMP := $(VENV)/.gpu-installed
# PyTorch for the tests of torch tensors: 2.13.0 is the CPU build this machine and CI hold on disk
# (from PyPI, that version is the CUDA build, several GB).
TORCH := torch==2.13.0
TORCH_STAMP := $(VENV)/.torch-installed
# Ray for the tests of `tensorwire ray-job` (a two-node cluster in network namespaces)
RAY_STAMP := $(VENV)/.ray-installed

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

$(RDMA_STAMP): $(STAMP) Makefile
	$(PY) -m pip install --quiet --no-deps '$(NIXL)'
	@touch $(RDMA_STAMP)

rdma: $(RDMA_STAMP)

$(TORCH_STAMP): $(STAMP) Makefile
	$(PY) -m pip install --quiet '$(TORCH)'
	@touch $(TORCH_STAMP)

$(RAY_STAMP): $(STAMP) Makefile
	$(PY) -m pip install --quiet -e '.[ray]'
	@touch $(RAY_STAMP)

$(GPU_STAMP): $(STAMP) Makefile
	$(PY) -m pip install --quiet '$(CUPY)'
	@touch $(GPU_STAMP)

# The project's own modules as bytecode, written ahead: an editable install has none, and where
# PYTHONDONTWRITEBYTECODE is set (as on this project's machines) every process would compile them
# again at each start (0.63 s against 0.37 s to import both daemons here; the suite starts
# hundreds). Stale files are skipped by Python and rewritten here.
BYTECODE := tensorwire client server bench tests examples
bytecode: $(STAMP)
	@$(PY) -m compileall -q -j 0 $(BYTECODE) >/dev/null

demo: $(STAMP) bytecode
	$(PY) -m tensorwire.client.demo

# A PyTorch CNN (examples/torch_digits.py) trained by one server and two workers.
demo-torch: $(STAMP) $(TORCH_STAMP) bytecode
	$(PY) -m tensorwire.client.demo --transports shm --steps 600 \
		--model examples/torch_digits.py:make --ps-args "--optimizer momentum --lr 0.05"

# The slowest tests are listed at the end: the suite must stay under 10 minutes in CI (2 cores).
# It runs in TEST_WORKERS processes (pytest-xdist): most tests wait on real timeouts and
# daemons, so more processes than cores pay. On this 2-core machine at 429a83c: 502.5 s in 2
# (the cores 50% busy), 373.0 s in 3 (76%), 332.9 s in 4 (86%). 3 was kept for the fault
# tests' timing margins (in 4 at 336bbef one failed: a receiver busy with a 64 MiB gRPC
# message answered no heartbeat for 0.9 s) while the suite grew to 570 s in 3,
# which with CI's set-up passed ten minutes. In 4, clean each time: 487.9 s and 452.3 s at
# d3774a3 (552.9 s in 3 between them; docs/fresh-clone-2026-12-01/workers-3-vs-4.txt), 456.9 s
# at 847f658, where 5 took 504.5 s (the cores saturated), clean too, and 566.2 s in 4 with a
# `yes > /dev/null` beside it taking a core's share: the margins hold on a slower machine
# (docs/test-workers-2026-12-02/).
# Every leak check is per process; the tests of one xdist_group (Ray's cluster) run in one
# process. TEST_WORKERS=0 runs it in this one process (pdb, -x, ordered output).
TEST_WORKERS ?= 4
test: $(STAMP) $(RDMA_STAMP) $(TORCH_STAMP) $(GPU_STAMP) $(RAY_STAMP) bytecode
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15

# The suite on the other Pythons `requires-python` admits, each where this machine has it (on
# PATH, or installed by pyenv without being its current version), in a virtual environment of
# its own (.venv-3.X: the dev extras, and NIXL where it has a wheel; no torch, cupy or Ray, whose
# tests skip there). Not in CI, which runs 3.11 (about 7 minutes each here); the 39th session's
# first such run found every daemon's --config broken on 3.10.
OTHER_PYTHONS ?= 3.10 3.12 3.13
test-pythons:
	@set -e; failed=""; for v in $(OTHER_PYTHONS); do \
	  py=$$(python$$v -c 'import sys; print(sys.executable)' 2>/dev/null || true); \
	  if [ -z "$$py" ] && command -v pyenv >/dev/null; then \
	    py=$$(ls -d "$$(pyenv root)"/versions/$$v.*/bin/python$$v 2>/dev/null | tail -n 1); fi; \
	  if [ -z "$$py" ]; then echo "== python$$v: not on this machine"; continue; fi; \
	  echo "== python$$v: $$py"; \
	  test -x .venv-$$v/bin/python || $$py -m venv .venv-$$v; \
	  .venv-$$v/bin/python -m pip install --quiet --upgrade pip; \
	  .venv-$$v/bin/python -m pip install --quiet -e '.[dev]'; \
	  .venv-$$v/bin/python -m pip install --quiet --no-deps '$(NIXL)' || echo "(no NIXL for $$v)"; \
	  .venv-$$v/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -p no:cacheprovider \
	    || failed="$$failed $$v"; \
	done; \
	if [ -n "$$failed" ]; then echo "== the suite failed on:$$failed"; exit 1; fi

# The suite with every dependency of the core and of the extras `dev` brings (the gRPC baseline,
# the daemons' data set and progress bars, the benchmark's plots, metrics) at the oldest version
# pyproject.toml admits (`name>=X` installed as `name==X`), in .venv-floors: a floor nobody
# installs is a floor nobody tests. `PYTHON=python3.10` for the oldest Python too (numpy 1.24
# has no wheel for 3.12 on). Not in CI (about 7 minutes of pytest here). Its first run
# (2026-11-29) found pyzmq 25's libzmq unable to bind a name with IPv6 addresses alone.
# `FLOOR_EXTRAS="grpc ps bench metrics torch ray"` adds the floors of torch (from PyPI its CUDA
# build, about 2.5 GB with its libraries; it runs on the CPU) and Ray, installed with the rest.
FLOOR_EXTRAS := grpc ps bench metrics
comma := ,
test-floors:
	@test -x .venv-floors/bin/python || $(PYTHON) -m venv .venv-floors
	.venv-floors/bin/python -m pip install --quiet --upgrade pip "tomli; python_version < '3.11'"
	.venv-floors/bin/python -c 'import re, sys; tomllib = __import__("tomllib" if sys.version_info >= (3, 11) else "tomli"); \
	  FLOOR_EXTRAS = "$(FLOOR_EXTRAS)"; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	  deps = p["dependencies"] + [d for x in FLOOR_EXTRAS.split() for d in p["optional-dependencies"][x]]; \
	  print("\n".join(dict.fromkeys(re.sub(r">=([^,]+).*", r"==\1", d) for d in deps if ">=" in d and ";" not in d)))' \
	  > .venv-floors/floors.txt
	@cat .venv-floors/floors.txt
	.venv-floors/bin/python -m pip install --quiet -c .venv-floors/floors.txt \
	  -e '.[dev,$(subst $() ,$(comma),$(strip $(FLOOR_EXTRAS)))]'
	.venv-floors/bin/python -m pip install --quiet --no-deps '$(NIXL)'
	.venv-floors/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup -p no:cacheprovider \
	  --ignore tests/test_lint.py  # (mypy reads the libraries' own type hints, older there)

# The GPU tests alone (marked `gpu`; they skip with the reason where no CUDA device is present).
test-gpu: $(STAMP) $(RDMA_STAMP) $(TORCH_STAMP) $(GPU_STAMP) bytecode
	$(PY) -m pytest -q -m gpu -rs

# What the lent GPU machine lacks, for the device tool's `carry` (../shared/gpu/README.md).
gpu-bundle:
	../shared/gpu/bundle.sh configargparse ml_dtypes msgpack

# (torch for --gloo: torch.distributed's send and recv measured beside the transports)
bench: $(STAMP) $(RDMA_STAMP) $(TORCH_STAMP) bytecode
	@mkdir -p bench-results
	$(PY) -m tensorwire.bench --gloo --json bench-results/bench.json --plot bench-results/bench.png

# The same checks as tests/test_lint.py, which holds the suite (and so CI) to them.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy tensorwire server client bench

# Long runs outside CI: the wire decoders fuzzed with hypothesis, an hour of soak (then ten minutes
# of it with senders killed and frozen at random, and five of batches, write_many of four tensors
# taken with wait_all, with the same faults), chaos.
fuzz: $(STAMP)
	$(PY) -m pytest -q tests/test_wire.py --hypothesis-profile=fuzz -p no:cacheprovider

soak: $(STAMP) $(RDMA_STAMP)
	$(PY) -m tensorwire.bench soak --duration 3600 --senders 5 --transports shm,tcp,nixl,grpc,grpc-stream
	$(PY) -m tensorwire.bench soak --duration 600 --senders 5 --transports shm,tcp,nixl,grpc,grpc-stream \
		--kill-every 0.5 --freeze-every 1 --heartbeat-timeout 2
	$(PY) -m tensorwire.bench soak --duration 300 --senders 5 --transports shm,tcp,nixl,grpc,grpc-stream \
		--api write_many --consume all --kill-every 0.5 --freeze-every 1 --heartbeat-timeout 2

# A training job whose daemons are killed, frozen and restarted at random: 5 minutes a transport.
# Five minutes of faults over each transport, each with other settings of the job (sync mode,
# optimizer, wire): asp/ssp with momentum or adam and the 16-bit wires met their first faults here.
# The last run has every fault `bench chaos` makes, with workers run as deploy/k8s runs them
# (--on-sigterm restart: stop-worker and drain-worker are evictions, exit 143, waited for):
# servers moved and workers evicted, as a Kubernetes node drain does. (Each run is one string;
# the loop splits it at spaces: none inside a flag's value.)
CHAOS_EVERY_FAULT := kill-worker,freeze-worker,stop-worker,drain-worker,kill-server,move-server,freeze-server
CHAOS_RUNS := "--transport shm" \
	"--transport tcp --sync ssp --optimizer momentum --wire-dtype bfloat16" \
	"--transport nixl --sync asp --optimizer adam" \
	"--transport grpc --wire-dtype float16" \
	"--transport shm --sync asp --events $(CHAOS_EVERY_FAULT) --worker-args=--on-sigterm=restart"
chaos: $(STAMP) $(RDMA_STAMP)
	set -e; for run in $(CHAOS_RUNS); do $(PY) -m tensorwire.bench chaos $$run --duration 300; done

# Regenerate the gRPC baseline's protobuf modules (committed; tests/test_proto.py checks them).
proto: $(STAMP)
	$(PY) -m grpc_tools.protoc -I. --python_out=. --grpc_python_out=. --pyi_out=. \
		tensorwire/transports/tensor_service.proto

clean:
	rm -rf $(VENV) .venv-3.* build dist *.egg-info .pytest_cache .ruff_cache .mypy_cache .hypothesis
	find $(BYTECODE) -name __pycache__ -type d -prune -exec rm -rf {} +
