# One image for the trainer (agents/, JAX on CPU) and the replaywatch sidecar.
#   docker-compose up --build      (see dashboards/README.md)
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TF_CPP_MIN_LOG_LEVEL=2

WORKDIR /app

# Dependencies first, so a code change does not reinstall TensorFlow and JAX. An editable
# install needs the package folder to exist; an empty one suffices for this layer. agents/
# is not installed (the wheel is replaywatch alone): `python -m agents.run` finds it in the
# working directory, /app.
COPY pyproject.toml constraints.txt README.md ./
RUN mkdir -p replaywatch \
    && touch replaywatch/__init__.py \
    && pip install -c constraints.txt -e '.[agents]'

COPY replaywatch ./replaywatch
COPY agents ./agents

RUN useradd --create-home --uid 10001 replaywatch \
    && mkdir -p /data && chown replaywatch /data
USER replaywatch

# Overridden per service in docker-compose.yml.
CMD ["python", "-m", "replaywatch", "--help"]
