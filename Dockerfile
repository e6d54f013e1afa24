# llm-scheduler's container image: the service alone (no engine), running as an unprivileged user.
#
#   docker build -t llm-scheduler .
#   docker run -v "$PWD/config:/etc/llmsched/config:ro" -p 50051:50051 -p 8080:8080 -p 9464:9464 llm-scheduler
#
# The config is /etc/llmsched/config/config.toml, in a mounted folder (in Kubernetes: the ConfigMap of
# deploy/kubernetes/), so a changed file is what a reload (SIGHUP, `llmsched reload`) reads. It must
# listen on 0.0.0.0 at the ports declared below: gRPC 50051, the OpenAI-compatible HTTP door 8080, /metrics 9464
# (the HEALTHCHECK asks 127.0.0.1:50051). The entrypoint is the `llmsched` command, so `docker run IMAGE sim
# --port 8000` runs the engine simulator and `docker run IMAGE health --target HOST:PORT` probes a scheduler.
# To pin the base by digest as well, append @sha256:<digest> to both FROM lines. docs/kubernetes.md says more.

# Build: a virtual environment in /opt/llmsched holding the service and its runtime dependencies only (no dev
# extras, no engines, no pip cache); the runtime stage copies it as it is (same base image, same paths).
FROM python:3.11.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY llmsched/ llmsched/
COPY scheduler_svc/ scheduler_svc/
COPY backends/ backends/
COPY clients/ clients/
RUN python -m venv /opt/llmsched \
    && /opt/llmsched/bin/pip install --no-cache-dir --disable-pip-version-check . \
    && /opt/llmsched/bin/pip uninstall --yes setuptools pip

FROM python:3.11.11-slim-bookworm
RUN groupadd --system --gid 10001 llmsched \
    && useradd --system --no-log-init --no-create-home --uid 10001 --gid 10001 --shell /usr/sbin/nologin llmsched
COPY --from=build /opt/llmsched /opt/llmsched
ENV PATH=/opt/llmsched/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1
# numeric, so Kubernetes' runAsNonRoot can check it without reading /etc/passwd
USER 10001:10001
# gRPC, the OpenAI-compatible HTTP door, Prometheus /metrics
EXPOSE 50051 8080 9464
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["llmsched", "health", "--target", "127.0.0.1:50051", "--timeout", "3"]
ENTRYPOINT ["llmsched"]
CMD ["serve", "--config", "/etc/llmsched/config/config.toml"]
