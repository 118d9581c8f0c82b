# The server's image (the default) or, with --build-arg EXTRAS=worker, the image of the Linux
# build workers and beat; the role is the command. The server installs without torch or
# coremltools: it reads build reports, it never converts.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY decodebench decodebench
COPY server server
COPY worker worker
COPY agent agent
COPY migrations migrations
# Point PIP_EXTRA_INDEX_URL at a CPU-only PyTorch index to keep the image small.
ARG PIP_EXTRA_INDEX_URL=""
ARG EXTRAS=server
RUN pip install --no-cache-dir ".[${EXTRAS}]"
EXPOSE 8000
CMD ["python", "-m", "server", "--host", "0.0.0.0", "--port", "8000"]
