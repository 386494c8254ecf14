# The Anarchon operator image.
#
#   DOCKER_BUILDKIT=1 docker build -t anarchon:dev .
#   docker run --rm anarchon:dev --help
#
# BuildKit's built-in Dockerfile frontend is enough (RUN --mount); there is no `# syntax=` line, so a
# build never fetches a frontend image from a registry.
#
# Build arguments and secrets, for builds where the defaults do not fit:
#   --build-arg BASE=...            another Python 3.11 base (tests/image builds on a local stand-in
#                                   made from Debian's packages, e2e/image/standin-base.sh)
#   --secret id=pip.conf,src=...    a pip configuration for both stages (index, proxy, CA path), and
#   --secret id=pip-ca,src=...      a CA bundle it can name as /run/secrets/pip-ca: how pip reaches
#                                   the package index behind a proxy. Neither is left in a layer.
#
# Two stages: the builder turns the repository into a wheel; the final stage installs that wheel with
# its [operator] extras into a virtualenv, without build tools, caches or the source tree.
# Expected size: about 230 MB uncompressed, about 80 MB compressed (python:3.11-slim is ~130 MB of it;
# psycopg[binary], aiohttp and kubernetes_asyncio (kept for exec-plugin kubeconfigs) are most of the rest).
#
# Runs as uid/gid 10001 with a read-only root filesystem: the only writable paths are /tmp and
# /var/lib/anarchon (the default SQLite store), which the Helm chart mounts as volumes.

ARG BASE=python:3.11-slim

FROM ${BASE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator ./operator
# The CRDs: operator/anarchon/crds links here, and the wheel carries them (anarchon lint reads the schema).
COPY crds/*.yaml ./crds/
RUN --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    --mount=type=secret,id=pip-ca \
    pip wheel --no-deps --wheel-dir /wheels .

FROM ${BASE}
LABEL org.opencontainers.image.title="anarchon" \
      org.opencontainers.image.description="Kubernetes operator for scheduled workloads: all-active replicas, one winner per slot, leases, takeover, fencing" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/anarchon \
    PATH=/opt/anarchon/bin:$PATH
# The wheel comes in through a bind mount, so it is not left in a layer. The bytecode is compiled at
# build time (nothing is written at run time), then setuptools and pip are removed from the venv:
# nothing uses them at run time, and scanners flag the versions a base brings.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    --mount=type=secret,id=pip-ca \
    python -m venv /opt/anarchon \
 && /opt/anarchon/bin/pip install --no-compile "$(ls /wheels/anarchon-*.whl)[operator]" \
 && /opt/anarchon/bin/python -m compileall -q -j 0 /opt/anarchon/lib \
 && /opt/anarchon/bin/pip uninstall -y setuptools pip \
 && groupadd --system --gid 10001 anarchon \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/anarchon \
        --shell /usr/sbin/nologin anarchon \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/anarchon
USER 10001:10001
WORKDIR /var/lib/anarchon
VOLUME ["/tmp", "/var/lib/anarchon"]
EXPOSE 8080 8081
ENTRYPOINT ["anarchon"]
CMD ["operator"]
