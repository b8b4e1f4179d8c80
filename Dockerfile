# The kvoffload operator image: `kvoffload run`, with every dependency from the hash locks.
# Build: make image   (docker build --build-arg VERSION=... -t kvoffload:VERSION .)

# Debian 12 slim with Python 3.11, pinned by the digest of its multi-arch index.
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# Build backend from its own lock, so the wheel build fetches nothing unpinned.
COPY requirements/build.lock requirements/runtime.lock requirements/
RUN python -m pip install --no-cache-dir --require-hashes -r requirements/build.lock \
    && python -m venv /opt/kvoffload \
    && /opt/kvoffload/bin/pip install --no-cache-dir --require-hashes -r requirements/runtime.lock
COPY pyproject.toml README.md hatch_build.py ./
# Without operator/kvoffload/lab (.dockerignore): the image carries the operator, not the lab.
COPY operator/ operator/
COPY templates/ templates/
RUN python -m pip wheel --no-cache-dir --no-build-isolation --no-deps --wheel-dir /wheels . \
    && /opt/kvoffload/bin/pip install --no-cache-dir --no-deps /wheels/kvoffload-*.whl

FROM ${PYTHON_IMAGE}
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="kvoffload" \
      org.opencontainers.image.description="Kubernetes operator that rolls out vLLM KV-cache offloading tier by tier, on SLO evidence" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/python:3.11.14-slim-bookworm"
ENV PATH=/opt/kvoffload/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
# Only the venv, owned by root: no build backend, wheel or pip cache from the build stage.
COPY --from=build /opt/kvoffload /opt/kvoffload
USER 65532:65532
ENTRYPOINT ["kvoffload", "run"]
