# retryd image: one image for every role (topics, worker, sidecar); the command picks the role.
#   docker build -t retryd .
#   docker run --rm retryd topics check -b kafka:9092 --main-topics orders

# --- build: wheels for retryd and all its dependencies ------------------------------------------
FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md* ./
COPY retryd ./retryd
RUN pip wheel --wheel-dir /wheels .

# --- runtime ------------------------------------------------------------------------------------
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RETRYD_STATE_DIR=/var/lib/retryd \
    RETRYD_SIDECAR_PORT=8080

# A fixed numeric uid/gid so orchestrators can verify runAsNonRoot and volumes can be chowned.
RUN groupadd --system --gid 10001 retryd \
 && useradd --system --uid 10001 --gid retryd --home-dir /var/lib/retryd --no-create-home \
        --shell /usr/sbin/nologin retryd \
 && mkdir -p /var/lib/retryd /etc/retryd \
 && chown retryd:retryd /var/lib/retryd

COPY --from=build /wheels /tmp/wheels
RUN pip install --no-index --find-links /tmp/wheels retryd && rm -rf /tmp/wheels

# The documented example settings; mount your own over it or use RETRYD_* variables.
COPY config/retryd.toml /etc/retryd/retryd.toml

USER 10001:10001
WORKDIR /var/lib/retryd
EXPOSE 8080

# Liveness of the sidecar (`retryd sidecar`). Worker containers override this with a heartbeat
# check (see docker-compose.yml); one-shot commands disable it.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request as u; port = os.environ.get('RETRYD_SIDECAR_PORT', '8080'); sys.exit(0 if u.urlopen('http://127.0.0.1:' + port + '/healthz', timeout=3).status == 200 else 1)"]

ENTRYPOINT ["retryd"]
CMD ["--help"]
