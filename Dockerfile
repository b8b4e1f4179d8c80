# The kvoffload operator image: `kvoffload run`, with every dependency from the hash locks.
# Build: make image   (scripts/build-image.sh: buildah, no daemon; BASE=debian builds a local base from Debian packages)

# Debian 12 slim with Python 3.11, pinned by the digest of its multi-arch index. Any base with Python 3.11 as
# `python3` works: scripts/build-image.sh BASE=debian passes a local one made from Debian's own python3 packages.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

FROM ${PYTHON_IMAGE} AS build
# A CA bundle for pip behind a TLS-intercepting proxy; build-image.sh mounts the host's when PIP_CERT is set.
# Build stage only: nothing of it reaches the final image.
ARG PIP_CERT
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements/build.lock requirements/runtime.lock requirements/
# `python3`, not `python`: Debian's python3 package has no `python`. The build backend gets a venv of its own (Debian's
# python3 refuses system-wide installs, PEP 668); the operator's venv is made without pip, and the build venv's pip
# installs into it from outside (--python), so the image carries no pip, setuptools or wheel.
RUN python3 -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir --require-hashes -r requirements/build.lock \
    && python3 -m venv --without-pip /opt/kvoffload \
    && /opt/build/bin/pip --python /opt/kvoffload/bin/python install --no-cache-dir \
        --require-hashes -r requirements/runtime.lock
COPY pyproject.toml README.md ./
# The operator and its CLI only: the lab is a distribution of its own (lab/), outside this context.
COPY operator/ operator/
COPY templates/ templates/
RUN /opt/build/bin/pip wheel --no-cache-dir --no-build-isolation --no-deps --wheel-dir /wheels . \
    && /opt/build/bin/pip --python /opt/kvoffload/bin/python install --no-cache-dir --no-deps /wheels/kvoffload-*.whl

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
ARG BASE_NAME=docker.io/library/python:3.11.14-slim-bookworm
LABEL org.opencontainers.image.title="kvoffload" \
      org.opencontainers.image.description="Kubernetes operator that rolls out vLLM KV-cache offloading tier by tier, on SLO evidence" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${BASE_NAME}"
ENV PATH=/opt/kvoffload/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Only the venv, owned by root: no build backend, wheel, pip or pip cache from the build stage.
COPY --from=build /opt/kvoffload /opt/kvoffload
USER 65532:65532
ENTRYPOINT ["kvoffload", "run"]
