# conveyor's image: one image for every role (api, worker, scheduler, migrate);
# compose/docker-compose.yml and deploy/kubernetes/ pick the role with the command.
# Your own jobs: an image FROM this one (compose/jobs-image/Dockerfile).
FROM python:3.11-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    CONVEYOR_DATA_DIR=/data

# Agent builds run their script in bubblewrap (util-linux's prlimit and setpriv come with the base image);
# git clones local repositories for github_clone builds. docs/builds.md: what the sandbox needs of the host.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap git \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY conveyor ./conveyor
# The otel extra: traces when OTEL_EXPORTER_OTLP_ENDPOINT (or CONVEYOR_OTEL=true) is set, nothing otherwise.
RUN pip install '.[otel]'

# Never run jobs as root. /data: uploads, build work trees and artifacts (CONVEYOR_DATA_DIR), a volume
# shared by the API and the agent workers.
RUN useradd --system --uid 10001 --home-dir /app conveyor \
    && mkdir -p /data && chown conveyor:conveyor /data
USER conveyor
VOLUME ["/data"]

# 8000: conveyor api; 9191: a worker supervisor's /metrics; 8081: its /livez and /healthz (--health-port).
EXPOSE 8000 9191 8081
CMD ["conveyor", "--help"]
