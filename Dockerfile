# retryd image: one image for every role (topics, worker, sidecar); the command picks the role.
#   docker build -t retryd .
#   docker run --rm retryd topics check -b kafka:9092 --main-topics orders
#
# Reproducible: the base image is pinned by digest (python:3.11-slim; refresh with
# `docker buildx imagetools inspect python:3.11-slim`) and every dependency comes from the
# hash-pinned lock requirements/runtime.lock (`pip install --require-hashes`). The embedded test
# broker (extra "embedded") is not in the image.

ARG PYTHON_IMAGE=python:3.11-slim@sha256:9c900dea9e8fb7e16277c179b555cc72d29a352dbc33cff48ad5a0412fd5bfc7

# --- build: a virtualenv with retryd and its locked dependencies -------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/retryd
COPY requirements/runtime.lock requirements/runtime.lock
RUN /opt/retryd/bin/pip install --no-cache-dir --require-hashes -r requirements/runtime.lock
COPY pyproject.toml README.md ./
COPY retryd ./retryd
RUN /opt/retryd/bin/pip install --no-cache-dir --no-deps . \
 && find /opt/retryd -name '__pycache__' -prune -exec rm -rf {} +

# --- runtime: the virtualenv only (no wheels, no build files, no caches) ------------------------
FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/retryd/bin:$PATH \
    RETRYD_STATE_DIR=/var/lib/retryd \
    RETRYD_SIDECAR_PORT=8080

# A fixed numeric uid/gid so orchestrators can verify runAsNonRoot and volumes can be chowned.
RUN groupadd --system --gid 10001 retryd \
 && useradd --system --uid 10001 --gid retryd --home-dir /var/lib/retryd --no-create-home \
        --shell /usr/sbin/nologin retryd \
 && mkdir -p /var/lib/retryd /etc/retryd \
 && chown retryd:retryd /var/lib/retryd

COPY --from=build /opt/retryd /opt/retryd
# The documented example settings; mount your own over it or use RETRYD_* variables.
COPY config/retryd.toml /etc/retryd/retryd.toml

USER 10001:10001
WORKDIR /var/lib/retryd
EXPOSE 8080

# Fits each role: a worker container is alive while its heartbeats are fresh, a sidecar while
# /healthz answers, a container running both needs both (`retryd health` finds what runs).
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 CMD ["retryd", "health"]

ENTRYPOINT ["retryd"]
CMD ["--help"]
