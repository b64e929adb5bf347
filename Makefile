# replaywatch: two commands do all the set-up on a fresh machine.
#   make demo   creates .venv, installs, runs the JAX agent with the sidecar attached
#   make test   creates .venv, installs (Python and Debian packages), runs every test
#   make test-fast   the edit-test loop: no Debian packages, no processes, no Reverb
#               or agents (tests marked slow are left out; see tests/conftest.py)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
DEADLOCK ?= 0
DEMO_PORT ?= 9321
PYTEST_ARGS ?=
# The Launchpad tier (tests/test_launchpad.py) runs real Launchpad programs from a second venv
# on Python 3.10 (dm-launchpad has cp37-cp310 wheels only), pinned in constraints-launchpad.txt.
# Without a Python 3.10 it is skipped with one line; REQUIRE_LAUNCHPAD=1 (CI's .ci/run) makes
# that a failure, so the tier cannot silently stop running.
LP_VENV := .venv-launchpad
LP_PY := $(LP_VENV)/bin/python
LP_STAMP := $(LP_VENV)/.installed
REQUIRE_LAUNCHPAD ?= 0
REQUIRE_RLLIB ?= 0
# make test's xdist workers: the JAX agent's tests in one lane (modules marked `agents` in
# tests/), the frameworks' own loops (Acme, TF-Agents, Launchpad, RLlib: `frameworks`) in a second,
# the rest in two beside them. Most of the suite waits on stall windows and real processes,
# so four lanes fill the two cores better than three; five kept them busy enough (1.6 of 2)
# that timing tests missed their bounds, and were no faster. TEST_WORKERS=0 runs everything
# in one process.
TEST_WORKERS ?= 4

# Debian packages the tests run for real: promtool/Prometheus, Alertmanager,
# Chromium for the status page, docker-compose to validate the compose file, jsonnet to
# build the monitoring mixin (dashboards/mixin/).
DEBIAN_PACKAGES := prometheus prometheus-alertmanager chromium docker-compose jsonnet

.PHONY: demo test test-memory test-ray test-fast lint typecheck bench bench-grid bench-grid-shapes bench-grid-fixes bench-long bench-bundles bench-memory bench-batch-stats bench-waste bench-rhythms bench-rllib-ratio bench-rllib-cost bench-rllib-probe-cost bench-rllib-memory bench-rllib-waste bench-poll-deadline bench-checkpoints bench-checkpoint-memory bench-fleet bench-ray-reads system-deps venv launchpad-venv rllib-venv clean

venv: $(STAMP)

# uv installs the pinned set (constraints.txt, uv itself pinned there) into the venv: 19 s
# on a fresh machine where pip took 43 s, and set-up counts in make test's time. Always
# byte-compiled at install (--compile-bytecode; pip does it by default): with
# PYTHONDONTWRITEBYTECODE set (as on our CI machines) Python would otherwise compile
# TensorFlow from source in every test process (make test 8 -> 13 min on a fresh clone).
UV := $(VENV)/bin/uv
# --system-certs: the machine's CA store, which our machines' pip is configured to use too.
UV_INSTALL := $(UV) pip install -q --python $(PY) --compile-bytecode --system-certs \
	-c constraints.txt
# uv first, alone: the main venv's packages and the other tiers' venvs are installed by it
# side by side (make -j3), not one after the other.
$(UV): constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c constraints.txt uv
	touch $(UV)

$(STAMP): pyproject.toml constraints.txt $(UV)
	$(UV_INSTALL) -e '.[agents,dev]'
	$(UV_INSTALL) --no-deps dm-acme dm-env  # tests/test_acme_real.py (its deps: no cp311 wheels)
	# tests/test_tf_agents.py: tf-agents 0.19.0, the release paired with TF 2.15 and Reverb
	# 0.14. Without its dependencies: its typing-extensions 4.5 pin would replace ours; what it
	# needs beside our pins is named here (gym 0.23's CartPole imports pygame at load time).
	$(UV_INSTALL) --no-deps tf-agents tensorflow-probability gin-config gym gym-notices \
		pygame decorator pillow
	touch $(STAMP)

# uv (from the main venv) builds it: about 1 GB, TensorFlow 2.8 the most of it.
launchpad-venv: $(UV)
	@py=$$(tools/python310) || py=""; \
	if [ -z "$$py" ]; then \
		echo "no Python 3.10 on this machine (PATH or pyenv): the Launchpad tier is skipped"; \
		[ "$(REQUIRE_LAUNCHPAD)" != 1 ] || { echo "REQUIRE_LAUNCHPAD=1: the Launchpad tier must run"; exit 1; }; \
	elif [ ! -f $(LP_STAMP) ] || [ constraints-launchpad.txt -nt $(LP_STAMP) ]; then \
		$(UV) venv -q --allow-existing --python "$$py" $(LP_VENV) && \
		$(UV) pip install -q --python $(LP_PY) --compile-bytecode --system-certs \
			-c constraints-launchpad.txt 'dm-launchpad[reverb]' tensorflow-cpu && \
		touch $(LP_STAMP); \
	fi

# The RLlib tier's venv (.venv-rllib, Python 3.11, pinned in constraints-rllib.txt):
# ray[default,rllib] with PyTorch on the CPU. torch alone by pip, --no-index: the CPU build
# on this machine's disk (pip's find-links; uv does not look there), never the index's CUDA
# build of several GB; its dependencies and Ray's by uv. About 1.7 GB. Not compiled to bytecode
# (1 s instead of 26 s of a fresh clone's set-up): what the jobs import, about a third, is
# compiled by one process (the PRELUDE of tests/support/rllib_jobs.py) before the jobs start.
# make test builds it beside the other venvs and runs, in its frameworks lane, a `ray start
# --head` cluster with six RLlib jobs watched by `--ray-job all` (tests/test_rllib_cluster.py:
# 123 to 139 s and 158 to 186 CPU-s alone, 165 to 229 s and 142 to 208 CPU-s in make test);
# REQUIRE_RLLIB=1 (CI's .ci/run) makes a skipped RLlib tier a failure.
RL_VENV := .venv-rllib
RL_PY := $(RL_VENV)/bin/python
RL_STAMP := $(RL_VENV)/.installed
rllib-venv: $(UV)
	@py=$$(command -v python3.11) || py=""; \
	if [ -z "$$py" ]; then \
		echo "no Python 3.11 on PATH: the RLlib tier is skipped"; \
		[ "$(REQUIRE_RLLIB)" != 1 ] || { echo "REQUIRE_RLLIB=1: the RLlib tier must run"; exit 1; }; \
	elif [ ! -f $(RL_STAMP) ] || [ constraints-rllib.txt -nt $(RL_STAMP) ]; then \
		{ test -x $(RL_PY) || "$$py" -m venv $(RL_VENV); } && \
		if ! $(RL_PY) -m pip install -q --no-compile --no-index --no-deps torch==2.13.0 2>/dev/null; then \
			echo "no CPU build of torch 2.13.0 in pip's find-links: the RLlib tier is skipped"; \
			[ "$(REQUIRE_RLLIB)" != 1 ] || { echo "REQUIRE_RLLIB=1: the RLlib tier must run"; exit 1; }; \
		else \
			$(UV) pip install -q --python $(RL_PY) --system-certs \
				-c constraints-rllib.txt 'ray[default,rllib]' filelock typing-extensions \
				setuptools sympy networkx jinja2 fsspec && \
			touch $(RL_STAMP); \
		fi; \
	fi

system-deps:
	@missing=""; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v prometheus-alertmanager >/dev/null || command -v alertmanager >/dev/null \
		|| missing="$$missing prometheus-alertmanager"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v docker-compose >/dev/null || missing="$$missing docker-compose"; \
	command -v jsonnet >/dev/null || missing="$$missing jsonnet"; \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages:$$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# The venv and the Debian packages are installed side by side (-j2): neither needs the other.
# The fifteen slowest tests are printed at the end: where the next minute of make test is.
test:
	@$(MAKE) --no-print-directory -j4 venv system-deps launchpad-venv rllib-venv
	$(PY) -m ruff check replaywatch agents harness tests bench tools deploy dashboards examples
	@# With PYTHONDONTWRITEBYTECODE set (our CI machines), every process the tests start would
	@# compile the project's own modules from source again: compiled once here, they are read.
	$(PY) -m compileall -q -j 0 replaywatch agents harness tests bench tools examples >/dev/null
	@# mypy (6 s) checks beside the tests, which leave a quarter of the cores idle; its verdict
	@# is printed after theirs, and either failing fails make test.
	@# pytest rewrites the asserts of every test module and of its plugins' (hypothesis,
	@# schemathesis: about 280 modules) in each xdist worker; with PYTHONDONTWRITEBYTECODE set it
	@# keeps none of it, and each worker's collection took 11 s of CPU instead of 8.
	@# The programs in FORKABLE (harness/procs.py: the Reverb workloads, the TF-Agents and Acme
	@# examples, the JAX agent) are forked from a zygote per xdist worker that imported their
	@# modules once (harness/zygote.py): some fifty processes imported TensorFlow and Reverb at
	@# 3.5 to 5 CPU-s each, a sixth of this CPU-bound suite.
	@# The JAX agent's processes (each test's trainer, each Ray actor) compile the same
	@# networks: XLA's executables kept in .cache/jax are read by the ones after the first.
	@# A test that failed beside the other lanes is run once more, alone (tools/retry_alone.py):
	@# passing there, make test passes and names it in capitals and in .flaky.log, a test whose
	@# bound judged the host's load; failing again, or more than three failing, fails make test.
	$(PY) -m mypy replaywatch > .mypy.log 2>&1 & typecheck=$$!; \
	export JAX_COMPILATION_CACHE_DIR=$(CURDIR)/.cache/jax JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0 \
	PYTHONDONTWRITEBYTECODE= REPLAYWATCH_FORK_WORKLOADS=1 REPLAYWATCH_LAUNCHPAD_PYTHON=$$( [ -f $(LP_STAMP) ] && echo $(LP_PY) ) \
	REPLAYWATCH_REQUIRE_LAUNCHPAD=$(REQUIRE_LAUNCHPAD) REPLAYWATCH_REQUIRE_RLLIB=$(REQUIRE_RLLIB); \
	rm -f .pytest_cache/v/cache/lastfailed; \
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15 $(PYTEST_ARGS); \
	tests=$$?; [ $$tests != 1 ] || { $(PY) tools/retry_alone.py; tests=$$?; }; \
	wait $$typecheck; types=$$?; cat .mypy.log; \
	[ $$tests = 0 ] && [ $$types = 0 ]

# The replay's memory on real servers, apart from make test for their time (about 7 minutes):
# a server in a real cgroup (as root, cgroup v1) filled until the kernel kills it, and a writer
# that keeps its episode alive (memory_leak) beside a full table in steady state (none).
test-memory: $(STAMP)
	REPLAYWATCH_MEMORY_TESTS=1 $(PY) -m pytest -q -p no:cacheprovider -n 2 -rP $(PYTEST_ARGS) \
		tests/test_memory_cgroup.py tests/test_memory_leak.py

# The Ray tier, apart from make test's budget (a Ray head takes about a minute to start
# here, and each case is a real job of 2 to 4 minutes: about 25 minutes in all): real RLlib
# jobs watched from outside with --ray (tests/test_rllib_tier.py, a local cluster per case,
# .venv-rllib, 12 s to build from this machine's caches), the distributed agent joining a
# `ray start --head`, and a multi-node cluster losing its actor node, then running the seed.
# Bytecode is written (PYTHONDONTWRITEBYTECODE emptied, as make test does): the first job
# compiles what RLlib imports, the ones after read it (a job cost 51.0 CPU-s with every
# process compiling, 32.4 with it written).
test-ray: $(STAMP) rllib-venv
	PYTHONDONTWRITEBYTECODE= REPLAYWATCH_RAY_TESTS=1 $(PY) -m pytest -q -p no:cacheprovider -rP $(PYTEST_ARGS) \
		tests/test_rllib_tier.py \
		tests/test_ray_cluster.py::test_a_ray_start_head_on_this_machine_is_joined_with_no_auth_variable \
		tests/test_ray_cluster.py::test_roles_on_their_own_nodes_learn_and_a_dead_actor_node_is_sample_blocked_then_recovers \
		tests/test_ray_cluster.py::test_the_seed_in_distributed_form_is_worker_starvation_with_probes_and_sample_blocked_without

# Two xdist workers: 840 tests in 37 s against 59 s in one process on this 2-core machine.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow" -p no:cacheprovider -n 2 $(PYTEST_ARGS)

lint: $(STAMP)
	$(PY) -m ruff check replaywatch agents harness tests bench tools deploy dashboards examples

typecheck: $(STAMP)
	$(PY) -m mypy replaywatch

demo: $(STAMP)
	DEADLOCK=$(DEADLOCK) DEMO_PORT=$(DEMO_PORT) $(PY) tools/demo.py

bench:
	@$(MAKE) --no-print-directory -j2 venv system-deps
	$(PY) -m bench.run_all

# The prediction grid (bench/predict_grid.py): the budget model against real runs, every fix
# it prints applied and run again; 43 cells one at a time, 40 minutes on 2 cores and up to
# an hour more for the seed's cell (its own loop, 8 minutes a run), so apart from make bench. Its table replaces the "Prediction grid" section of bench/RESULTS.md.
bench-grid: $(STAMP)
	$(PY) -m bench.predict_grid --runs 2 --results bench/RESULTS.md

# Shapes not our own (bench/predict_shapes_cells.json): loops that step on a schedule,
# TF-Agents' batch after the interleave, actors paced ahead of what was consumed; a table per
# family in bench/RESULTS.md (about 20 minutes).
bench-grid-shapes: $(STAMP)
	$(PY) -m bench.predict_grid --shapes --runs 2 --results bench/RESULTS.md

# What the fixes say beyond their value (about 25 minutes): each error_buffer fix at its value,
# the one above and the next hundred, and the pair fixes (one pair on the seed's own loop for
# 480 s), since a finding says any larger error_buffer holds too; then the largest smaller
# batch each batch_size fix warns can hang.
bench-grid-fixes: $(STAMP)
	$(PY) -m bench.predict_grid --buffer-fixes --results bench/RESULTS.md
	$(PY) -m bench.predict_grid --batch-warnings --results bench/RESULTS.md
	$(PY) -m bench.predict_grid --first-step-fixes --results bench/RESULTS.md

# Long healthy runs (a learner with 12 s steps among them) and throughput_drop's detection
# times (about 60 minutes).
bench-long:
	@$(MAKE) --no-print-directory -j2 venv system-deps
	$(PY) -m bench.long --results bench/RESULTS.md

# The replay's memory against a real cgroup v1 limit (about 7 minutes, as root): a table that
# cannot fit (memory_exhaustion's lead and time left, the OOM kill) and one that fits (five
# minutes full, no finding), and what reading the memory costs a poll.
bench-memory: $(STAMP)
	$(PY) -m bench.memory --results bench/RESULTS.md

# wasted_experience against real tables of five shape families, every fix it prints applied
# and run again (about 5 minutes).
bench-waste: $(STAMP)
	$(PY) -m bench.waste --results bench/RESULTS.md

# Jobs of every rhythm (steps 0.05 s to 60 s, sync and async, prefetch 0 to 8, 1 to 64
# actors), each watched by three sidecars (Reverb alone, the learner's probe, every probe):
# the healthy ones 10 minutes with nothing paged, the hung ones named within their window
# (about 35 minutes, the cells side by side).
bench-rhythms: $(STAMP)
	$(PY) -m bench.rhythms --results bench/RESULTS.md

# Real RLlib DQN jobs (.venv-rllib) against `replaywatch predict --rllib`: about 8 minutes.
bench-rllib-ratio: $(STAMP) rllib-venv
	$(PY) -m bench.rllib_ratio --results bench/RESULTS.md

# Four real Reverb servers, one stopped for a minute: the others' polls keep their time
# (about 2 minutes).
bench-poll-deadline: $(STAMP)
	$(PY) -m bench.poll_deadline --results bench/RESULTS.md

# A 1.25 GiB replay checkpointed (a write of 20 to 30 s here) beside three servers, then restored
# under a cpu cgroup (as root) so that its load lasts long enough to judge the ETA (3 minutes).
bench-checkpoints: $(STAMP)
	$(PY) -m bench.checkpoints --results bench/RESULTS.md

# A full replay inserting while it checkpoints, in a cgroup v1 memory group (as root): the items
# the write keeps alive named before the kernel's kill, and the printed fixes holding, in two
# shapes (3.5 minutes).
bench-checkpoint-memory: $(STAMP)
	$(PY) -m bench.checkpoint_memory --results bench/RESULTS.md

# 32 Reverb servers and 512 probes in a targets file under one sidecar at 1 Hz, then one more
# server stopped for 60 s beside them, then split over two shards (about 6 minutes).
bench-fleet: $(STAMP)
	$(PY) -m bench.fleet --results bench/RESULTS.md

# N RLlib jobs of one cluster polled alone against sharing their common reads (about 2 min).
bench-ray-reads: $(STAMP)
	$(PY) -m bench.ray_shared_reads --results bench/RESULTS.md

# One real RLlib DQN job in windows unwatched and watched by `watch --ray`, paired inside the
# job: what the sidecar costs it (about 6 minutes).
bench-rllib-cost: $(STAMP) rllib-venv
	$(PY) -m bench.rllib_cost --results bench/RESULTS.md

# The same job running the RLlibProbe, read by the sidecar through it: what the probe's
# answers add to the driver (about 6 minutes).
bench-rllib-probe-cost: $(STAMP) rllib-venv
	$(PY) -m bench.rllib_cost --probe --results bench/RESULTS.md

# Real DQN jobs with frame-sized observations: the driver's memory at its buffer's capacity,
# projected from the RLlibProbe as the buffer fills, against what it used once full; then one
# run into a real cgroup limit, and the capacity it printed run in that limit (~12 min).
bench-rllib-memory: $(STAMP) rllib-venv
	$(PY) -m bench.rllib_memory --results bench/RESULTS.md

# Real DQN jobs at four replay ratios, two shapes, whose buffer counts the env steps it evicts never
# sampled, against the sidecar's e^-s estimate; then the training_intensity it printed, run
# (~11 min).
bench-rllib-waste: $(STAMP) rllib-venv
	$(PY) -m bench.rllib_waste --results bench/RESULTS.md

# TF-Agents' DQN job that hangs, on the plain and the TF-Agents recipe, its server in-process
# and over gRPC: every fix the sidecar prints applied and trained 300 steps under its watch
# (about 5 minutes, one job at a time).
bench-tf-agents-fixes: $(STAMP)
	$(PY) -m bench.tf_agents_fixes --results bench/RESULTS.md

# What the trainer probe's batch statistics cost a learner step at batch 256 (two minutes).
bench-batch-stats: $(STAMP)
	$(PY) -m bench.batch_stats --results bench/RESULTS.md

# Every real-Reverb reproduction's bundles: sizes, and each replayed against the live verdict
# (about 3 minutes).
bench-bundles: $(STAMP)
	$(PY) -m bench.bundle_sizes --results bench/RESULTS.md

clean:
	rm -rf $(VENV) $(LP_VENV) .pytest_cache .mypy_cache .ruff_cache
