# One image for the API, the workers and the migration job of docker-compose.yml.
#
# Packages come from the build's pip configuration, plus the indexes in the PIP_EXTRA_INDEX_URL
# build argument (docker-compose.yml forwards it from the environment; empty adds none).
# torch==2.13.0 should be its CPU build: add an index of CPU-only torch wheels to keep the image small.
FROM python:3.11-slim

ARG PIP_EXTRA_INDEX_URL
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    TQDM_DISABLE=1 \
    ARTSVC_DATA_DIR=/data
WORKDIR /app

# The dependencies first, in their own layer, so a code change does not reinstall torch.
COPY pyproject.toml ./
RUN python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies'], sep='\n')" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt

# The project itself, installed like any package (its splits, migrations and prompts are package data): the image
# runs the installed code, not a source tree.
COPY . /tmp/artsvc
RUN pip install --no-deps /tmp/artsvc \
    && rm -rf /tmp/artsvc \
    && useradd --create-home --uid 10001 artsvc \
    && mkdir -p /data \
    && chown artsvc /data

USER artsvc
VOLUME /data
EXPOSE 8000
# The API and ARTSVC_WORKERS (1) worker processes; on SIGTERM the workers checkpoint their current step first,
# so give them time: `docker stop -t 120` (compose runs the workers as containers of their own instead).
CMD ["artsvc", "serve", "--host", "0.0.0.0"]
