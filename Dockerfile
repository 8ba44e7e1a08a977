# tsproxy container image. Build and try it (embedded file:// backend, dev credentials):
#   docker build -t tsproxy .
#   docker run --rm -p 9000:9000 -p 9102:9102 tsproxy
# Arguments after the image name are appended to `tsproxy serve --listen ... --metrics-listen ...`, e.g.
#   docker run -v "$PWD/tsproxy.toml:/etc/tsproxy/tsproxy.toml:ro" -v tsproxy-cache:/var/lib/tsproxy/tsproxy-cache \
#     -p 9000:9000 -p 9102:9102 tsproxy --config /etc/tsproxy/tsproxy.toml
# The data pipeline (`tsproxy export`, `tsproxy jobs`) needs the 'spark' extra and a Java runtime:
#   docker build --build-arg EXTRAS=fast,spark -t tsproxy-pipeline .
#   docker run --rm --entrypoint tsproxy tsproxy-pipeline jobs verify --config /etc/tsproxy/tsproxy.toml ...

# Extras of the tsproxy package to install (comma-separated): fast (uvloop), spark (the pipeline).
ARG EXTRAS=fast

# Build stage: resolve and install tsproxy and its dependencies into a self-contained virtualenv.
FROM python:3.11-slim AS build
ARG EXTRAS
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/tsproxy
COPY pyproject.toml README.md ./
COPY tsproxy ./tsproxy
# Every dependency of every extra ships manylinux wheels, so no compiler is needed.
RUN /opt/tsproxy/bin/pip install --no-cache-dir ".[${EXTRAS}]"

# Runtime stage: the virtualenv only (plus Java for Spark), run by an unprivileged user.
FROM python:3.11-slim
ARG EXTRAS
# Spark runs on the JVM: the image with the 'spark' extra gets Debian's headless Java runtime, at the
# version the base image's release ships (so not pinned).
# hadolint ignore=DL3008
RUN case ",${EXTRAS}," in \
      *,spark,*) apt-get update \
        && apt-get install -y --no-install-recommends default-jre-headless \
        && rm -rf /var/lib/apt/lists/* ;; \
    esac
RUN groupadd --system --gid 10001 tsproxy \
    && useradd --system --uid 10001 --gid tsproxy --home-dir /var/lib/tsproxy --shell /usr/sbin/nologin tsproxy \
    && mkdir -p /var/lib/tsproxy/tsproxy-cache /etc/tsproxy \
    && chown -R tsproxy:tsproxy /var/lib/tsproxy
COPY --from=build /opt/tsproxy /opt/tsproxy
ENV PATH=/opt/tsproxy/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
USER 10001:10001
# The relative defaults (cache_dir ./tsproxy-cache, backend file://./tsproxy-data) resolve under here.
WORKDIR /var/lib/tsproxy
# The chunk cache at its default place, so it survives container restarts unless cache_dir is set elsewhere.
VOLUME ["/var/lib/tsproxy/tsproxy-cache"]
# 9000: S3 API. 9102: /metrics, /healthz, /readyz.
EXPOSE 9000 9102
# The slim image has no curl: ask /healthz with the interpreter that is already there.
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request as u; u.urlopen('http://127.0.0.1:9102/healthz', timeout=2)"]
ENTRYPOINT ["tsproxy", "serve", "--listen", "0.0.0.0:9000", "--metrics-listen", "0.0.0.0:9102"]
