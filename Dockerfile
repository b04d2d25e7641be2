# conveyor's image: one image for every role (api, worker, scheduler, migrate);
# compose/docker-compose.yml picks the role with the command.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app
COPY pyproject.toml README.md ./
COPY conveyor ./conveyor
RUN pip install .

# Never run jobs as root.
RUN useradd --system --uid 10001 --home-dir /app conveyor
USER conveyor

# 8000: conveyor api; 9191: a worker supervisor's /metrics.
EXPOSE 8000 9191
CMD ["conveyor", "--help"]
