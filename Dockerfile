# syntax=docker/dockerfile:1
# llm-governor image: `governor run` (the service) and `governor engine-args` (for engines'
# init containers). Multi-stage: the build stage installs the package into a virtualenv;
# the runtime stage copies only that virtualenv, so no pip, build tools or sources ship.
#
# The base image is pinned to an exact Python patch release and Debian release; pin its
# digest too when publishing (docker buildx imagetools inspect <tag>), e.g.
#   docker build --build-arg PYTHON_IMAGE=python:3.11.13-slim-bookworm@sha256:<digest> .
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
RUN python -m venv /opt/governor
# Metadata first, so the dependency layer is reused while only our sources change.
COPY pyproject.toml README.md ./
COPY controller/ controller/
COPY estimators/ estimators/
COPY actuators/ actuators/
COPY simulator/ simulator/
COPY service/ service/
COPY governor_api/ governor_api/
COPY governor_engine/ governor_engine/
# Bytecode is compiled here: the runtime root filesystem is read-only
# (securityContext.readOnlyRootFilesystem), so Python could not write it at start.
RUN /opt/governor/bin/pip install . \
 && /opt/governor/bin/python -m compileall -q /opt/governor \
 && /opt/governor/bin/governor --help > /dev/null

FROM ${PYTHON_IMAGE} AS runtime
# A fixed numeric non-root user: Kubernetes' runAsNonRoot can only verify a numeric USER
# (the chart's podSecurityContext uses the same 10001).
RUN groupadd --system --gid 10001 governor \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin governor
COPY --from=build /opt/governor /opt/governor
ENV PATH=/opt/governor/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
# gRPC (KEDA external scaler, engines, admin API) and Prometheus /metrics.
EXPOSE 50051 9464
ENTRYPOINT ["governor"]
CMD ["run", "--config", "/etc/governor/config.yaml"]
