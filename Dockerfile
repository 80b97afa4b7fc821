# The image of every vime service in docker-compose.yml: the trainer, the rollout workers, the vLLM
# servers and the router (GPU hosts: the `gpu` extra brings vLLM with CUDA).
FROM python:3.11-slim-bookworm
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap git && rm -rf /var/lib/apt/lists/*
WORKDIR /vime
COPY pyproject.toml README.md ./
COPY vime vime
COPY workers workers
COPY workflows workflows
COPY activities activities
RUN pip install --no-cache-dir -e ".[gpu,postgres]"
ENV PYTHONUNBUFFERED=1
