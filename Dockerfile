# syntax=docker/dockerfile:1
# tsproxy container image. Build and try it (embedded file:// backend, dev credentials):
#   docker build -t tsproxy:0.1.0 .
#   docker run --rm -p 9000:9000 -p 9102:9102 tsproxy:0.1.0
# Arguments after the image name are appended to `tsproxy serve --listen ... --metrics-listen ...`, e.g.
#   docker run -v "$PWD/tsproxy.toml:/etc/tsproxy/tsproxy.toml:ro" -v tsproxy-cache:/var/lib/tsproxy/tsproxy-cache \
#     -p 9000:9000 -p 9102:9102 tsproxy:0.1.0 --config /etc/tsproxy/tsproxy.toml
# The data pipeline (`tsproxy export`, `tsproxy jobs`) needs the 'spark' extra; that image brings Java:
#   docker build --build-arg EXTRAS=fast,spark -t tsproxy-pipeline:0.1.0 .
#   docker run --rm --entrypoint tsproxy tsproxy-pipeline:0.1.0 jobs verify --config /etc/tsproxy/tsproxy.toml ...
# Behind a TLS-intercepting proxy, hand the build its CA bundle as the secret `ca`: only the steps that
# fetch see it, and no layer keeps it:
#   docker build --secret id=ca,src=/etc/ssl/certs/ca-certificates.crt -t tsproxy:0.1.0 .
# Without Docker, deploy/image/build.py (`make image`) builds both images with buildah.

# The base of both stages: any Debian-based image with python3 (3.11 or newer) and python -m venv.
ARG BASE=python:3.11-slim
# Extras of the tsproxy package to install (comma-separated): fast (uvloop), spark (the pipeline).
ARG EXTRAS=fast

# Build stage: tsproxy and its dependencies in a self-contained virtualenv, trimmed; for the pipeline,
# a Java runtime cut down to the modules Spark uses.
FROM ${BASE} AS build
# pip compiles every module it installs: the image starts without compiling (it could not write them).
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Up to `ARG EXTRAS` the steps do not depend on the extras: both images share their layers.
# binutils strips the libraries.
# hadolint ignore=DL3008,SC2086
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then ca="-o Acquire::https::CAInfo=/run/secrets/ca"; else ca=""; fi \
    && apt-get $ca update \
    && DEBIAN_FRONTEND=noninteractive apt-get $ca install -y --no-install-recommends binutils \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
RUN python -m venv /opt/tsproxy
# The dependencies first, from pyproject.toml alone, so that a change to tsproxy's code rebuilds less.
# Every dependency of every extra ships manylinux wheels (pyspark a pure-Python sdist): no compiler needed.
COPY pyproject.toml ./
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
      > requirements.txt \
    && /opt/tsproxy/bin/pip install --no-cache-dir -r requirements.txt
ARG EXTRAS
# The pipeline's Java runtime is made by the JDK's jlink, below.
# hadolint ignore=DL3008,SC2086
RUN --mount=type=secret,id=ca \
    case ",${EXTRAS}," in \
      *,spark,*) if [ -s /run/secrets/ca ]; then ca="-o Acquire::https::CAInfo=/run/secrets/ca"; else ca=""; fi \
        && apt-get $ca update \
        && DEBIAN_FRONTEND=noninteractive apt-get $ca install -y --no-install-recommends default-jdk-headless \
        && rm -rf /var/lib/apt/lists/* ;; \
    esac
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && python -c 'import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
extras = [e for e in sys.argv[1].split(",") if e]; \
unknown = set(extras) - set(p["optional-dependencies"]); \
sys.exit(f"EXTRAS: no extra {sorted(unknown)}") if unknown else None; \
print("\n".join(d for e in extras for d in p["optional-dependencies"][e]))' \
      "${EXTRAS}" > extras.txt \
    && /opt/tsproxy/bin/pip install --no-cache-dir -r requirements.txt -r extras.txt
# What tsproxy never loads goes: tests, sources, pyarrow's Flight and S3, symbols, other platforms' natives.
COPY deploy/image/slim.py ./
RUN /opt/tsproxy/bin/python slim.py /opt/tsproxy
# Spark's JVM needs these modules (jdeps over its jars, and the --add-modules its launcher passes).
RUN case ",${EXTRAS}," in \
      *,spark,*) jlink --output /opt/java --strip-debug --no-man-pages --no-header-files --compress=2 \
        --add-modules java.base,java.compiler,java.datatransfer,java.desktop,java.instrument,java.logging,java.management,java.naming,java.net.http,java.prefs,java.rmi,java.scripting,java.security.jgss,java.security.sasl,java.sql,java.transaction.xa,java.xml,jdk.crypto.ec,jdk.incubator.vector,jdk.management,jdk.naming.dns,jdk.security.auth,jdk.security.jgss,jdk.unsupported,jdk.zipfs \
        && cp -L /etc/ssl/certs/java/cacerts /opt/java/lib/security/cacerts ;; \
      *) mkdir /opt/java ;; \
    esac
COPY README.md ./
COPY tsproxy ./tsproxy
# tsproxy itself, then pip and setuptools leave: nothing installs into the image at run time.
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi \
    && /opt/tsproxy/bin/pip install --no-cache-dir --no-deps . \
    && /opt/tsproxy/bin/pip uninstall --yes pip setuptools

# Runtime stage: the virtualenv (and for the pipeline the Java runtime), run by an unprivileged user.
FROM ${BASE}
RUN groupadd --system --gid 10001 tsproxy \
    && useradd --system --uid 10001 --gid tsproxy --home-dir /var/lib/tsproxy --shell /usr/sbin/nologin tsproxy \
    && mkdir -p /var/lib/tsproxy/tsproxy-cache /etc/tsproxy \
    && chown -R tsproxy:tsproxy /var/lib/tsproxy
# Owned by root, so the process cannot change its own code.
COPY --from=build /opt/java /opt/java
COPY --from=build /opt/tsproxy /opt/tsproxy
ENV PATH=/opt/tsproxy/bin:/opt/java/bin:$PATH \
    JAVA_HOME=/opt/java \
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
