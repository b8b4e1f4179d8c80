# kvoffload: `make demo` and `make test` set up everything they need on a fresh Debian 12 machine.
# Setup steps leave stamp files (in the venvs, and the built model) so a second run skips them.

PYTHON ?= python3
VENV := .venv
VLLM_VENV := .venv-vllm
SBOM_VENV := .venv-sbom
VLLM_033 := .vllm-033
VLLM_034 := .vllm-034
SGLANG_05 := .sglang-05
TINY_MODEL := .tiny-model
KUBE_BIN := .kube-bin
LINT_PATHS := operator lab tests bench scripts
UV_VERSION := 0.13.9
UV := $(VENV)/bin/uv
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE ?= kvoffload:$(VERSION)
# apt-get needs root; use sudo only where we are not root already.
SUDO := $(shell [ "$$(id -u)" -eq 0 ] || echo sudo)

# Tests and the demo start `kvoffload`, `hadolint`, ... by name.
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

# `make test`, setup included, ends inside CI's 90 minutes: tests/support/deadlines.py starts no test within 10
# minutes of this deadline (epoch seconds) and ends the run at it, printing every thread's stack. Set it to `off`
# to lift it.
ifndef KVOFFLOAD_TEST_DEADLINE
KVOFFLOAD_TEST_DEADLINE := $(shell echo $$(( $$(date +%s) + 85 * 60 )))
endif
export KVOFFLOAD_TEST_DEADLINE

.DEFAULT_GOAL := help
.PHONY: help setup system-deps kube test lint demo lock image release

help:
	@echo "make demo    set up, then run 'kvoffload demo' (the whole loop on this machine)"
	@echo "make test    set up, then ruff, mypy and the whole pytest suite, real vLLM tier included"
	@echo "make setup   install what the two above need (apt packages, .venv, .venv-sbom, .venv-vllm, .vllm-033, .vllm-034, .sglang-05, .tiny-model, .kube-bin with the Prometheus Operator)"
	@echo "make lock    regenerate requirements/*.lock with uv"
	@echo "make image   build the operator image with buildah (BASE=debian: a local Debian base; ARCHES=\"amd64 arm64\")"
	@echo "make release write the release into dist/: wheel, sdist, chart, SBOMs, krew archive, SHA256SUMS, notes"

setup: system-deps $(VENV)/.kvoffload-setup $(SBOM_VENV)/.kvoffload-setup $(VLLM_VENV)/.kvoffload-setup $(VLLM_033)/.kvoffload-setup \
	$(VLLM_034)/.kvoffload-setup $(SGLANG_05)/.kvoffload-setup $(TINY_MODEL)/config.json kube

# The real control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler), built from the Go
# modules pinned in tools/kube, and the Prometheus Operator with its CRDs, from tools/prometheus-operator;
# each script skips the build when its stamp matches (cold: 11-15 min, and about 1.5 min, on 2 cores).
# Beside them argocd-diff, Argo CD's own diff and deletion for tests/gitops/ (tools/argocd-diff), and the CNCF
# distribution registry for the chart's OCI test (tools/registry).
kube:
	scripts/build-kube.sh $(KUBE_BIN)
	scripts/build-prometheus-operator.sh $(KUBE_BIN)
	tools/argocd-diff/build.sh $(KUBE_BIN)
	tools/registry/build.sh $(KUBE_BIN)

# Debian packages: Prometheus (with promtool) for the Prometheus tier, Alertmanager for the notification
# tier (tests/notify/test_alertmanager.py), buildah, podman, runc and mmdebstrap for the image check
# (tests/test_image.py), and venv support for a Debian-packaged Python. Nothing to do when all are there.
system-deps:
	@missing=""; \
	command -v promtool >/dev/null || missing="$$missing prometheus"; \
	command -v prometheus-alertmanager >/dev/null || missing="$$missing prometheus-alertmanager"; \
	for tool in buildah podman runc mmdebstrap; do \
		command -v $$tool >/dev/null || [ -x /usr/sbin/$$tool ] || missing="$$missing $$tool"; \
	done; \
	$(PYTHON) -c 'import ensurepip, venv' 2>/dev/null || missing="$$missing python3-venv"; \
	if [ -n "$$missing" ]; then \
		echo "apt-get install:$$missing"; \
		$(SUDO) apt-get update -q && \
		$(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

# The development venv: exactly the hash-pinned test lock, then kvoffload itself and its lab (lab/: `kvoffload demo`,
# `emulate`, `cluster`, `calibrate`), editable; the lock already holds the lab's dependencies.
$(VENV)/.kvoffload-setup: requirements/test.lock pyproject.toml lab/pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes -r requirements/test.lock
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e ./lab
	touch $@

# The SBOM tool of `make release` (cyclonedx-py) in a venv of its own, from its hash-pinned lock (requirements/sbom.in
# says why).
$(SBOM_VENV)/.kvoffload-setup: requirements/sbom.lock
	test -x $(SBOM_VENV)/bin/python || $(PYTHON) -m venv $(SBOM_VENV)
	$(SBOM_VENV)/bin/python -m pip install --quiet --disable-pip-version-check --require-hashes -r requirements/sbom.lock
	touch $@

# vLLM for CPU in a venv of its own (its torch and transformers pins are not ours).
$(VLLM_VENV)/.kvoffload-setup: scripts/setup-vllm.sh requirements/vllm.lock
	PYTHON=$(PYTHON) scripts/setup-vllm.sh $(VLLM_VENV)
	touch $@

# vLLM 0.33.0's sources laid over that venv, for 0.33's argument parser (no second torch).
$(VLLM_033)/.kvoffload-setup: scripts/setup-vllm-sources.sh requirements/vllm-0.33.lock $(VLLM_VENV)/.kvoffload-setup
	scripts/setup-vllm-sources.sh 0.33.0 $(VLLM_033) $(VLLM_VENV)
	touch $@

# vLLM 0.34.0's sources laid over it the same way, for 0.34's argument parser.
$(VLLM_034)/.kvoffload-setup: scripts/setup-vllm-sources.sh requirements/vllm-0.34.lock $(VLLM_VENV)/.kvoffload-setup
	scripts/setup-vllm-sources.sh 0.34.0 $(VLLM_034) $(VLLM_VENV)
	touch $@

# SGLang 0.5.23's sources laid over that venv too, for SGLang's own parser, resolution steps and metrics
# collectors (tests/sglang_argcheck.py): the wheel's torch 2.14 and CUDA kernels are not needed for those.
$(SGLANG_05)/.kvoffload-setup: scripts/setup-sglang-sources.sh requirements/sglang-0.5.lock $(VLLM_VENV)/.kvoffload-setup
	scripts/setup-sglang-sources.sh 0.5.23 $(SGLANG_05) $(VLLM_VENV)
	touch $@

$(TINY_MODEL)/config.json: scripts/make_tiny_model.py $(VLLM_VENV)/.kvoffload-setup
	$(VLLM_VENV)/bin/python scripts/make_tiny_model.py $(TINY_MODEL)

lint: $(VENV)/.kvoffload-setup
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)
	$(VENV)/bin/mypy

# Three workers (pytest-xdist), each taking a whole file at a time, the longest files first (tests/support/ordering.py):
# the e2e tiers mostly wait on real processes and timers (2 cores were 40 % idle while two of them ran), so three share
# 2 cores well; the 25 slowest tests close the summary.
test: setup lint
	$(VENV)/bin/pytest -n 3 --dist loadfile --no-loadscope-reorder --durations=25

# The demo runs emulated engines, so it needs neither vLLM nor the tiny model; it runs on the real
# control plane (`kvoffload demo --api emulated` does not need it).
demo: system-deps $(VENV)/.kvoffload-setup kube
	$(VENV)/bin/kvoffload demo

$(UV):
	$(VENV)/bin/python -m pip install --quiet --disable-pip-version-check uv==$(UV_VERSION)

# Left out of the vLLM lock: torchvision/torchaudio/torchcodec (CUDA builds, not needed to serve
# text), and what PyPI's CUDA torch asks for but never loads on a machine with no GPU: triton,
# cuSOLVER, NVTX, the CUDA Python bindings, the empty cuda-toolkit metapackage. The nvidia
# libraries that torch links at import stay in (see scripts/setup-vllm.sh).
VLLM_NOT_LOCKED := triton torchvision torchaudio torchcodec \
	cuda-toolkit cuda-bindings cuda-pathfinder nvidia-cusolver nvidia-nvtx

# Keeps the pins already there unless asked (uv reads the old lock as preferences);
# `make lock UV_FLAGS=--upgrade` moves everything to the newest allowed versions.
lock: $(UV)
	$(UV) pip compile --quiet pyproject.toml --generate-hashes --python-version 3.11 $(UV_FLAGS) \
		-o requirements/runtime.lock
	$(UV) pip compile --quiet pyproject.toml --extra test --generate-hashes --python-version 3.11 $(UV_FLAGS) \
		-c requirements/runtime.lock -o requirements/test.lock
	$(UV) pip compile --quiet requirements/build.in --generate-hashes --python-version 3.11 $(UV_FLAGS) \
		-o requirements/build.lock
	$(UV) pip compile --quiet requirements/sbom.in --generate-hashes --python-version 3.11 $(UV_FLAGS) \
		-o requirements/sbom.lock
	$(UV) pip compile --quiet requirements/vllm.in --generate-hashes --python-version 3.11 $(UV_FLAGS) \
		--overrides requirements/vllm-overrides.txt $(addprefix --no-emit-package ,$(VLLM_NOT_LOCKED)) \
		-o requirements/vllm.lock

# The operator image, by buildah (no daemon): `make image BASE=debian` builds on a local base made from Debian's
# packages (mmdebstrap) where the pinned python image cannot be pulled; ARCHES="amd64 arm64" builds both into a
# manifest list (arm64 through qemu-user-static). Prints each image's size.
image:
	scripts/build-image.sh IMAGE=$(IMAGE) VERSION=$(VERSION) $(if $(BASE),BASE=$(BASE)) $(if $(ARCHES),ARCHES="$(ARCHES)")

# Every artifact of a release, reproducibly (SOURCE_DATE_EPOCH: the last commit's time), into dist/; the version
# is pyproject.toml's, and the release stops if charts/kvoffload/Chart.yaml disagrees (scripts/release.py).
release: $(VENV)/.kvoffload-setup $(SBOM_VENV)/.kvoffload-setup
	$(VENV)/bin/python scripts/release.py --out dist
