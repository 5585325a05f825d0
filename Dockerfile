# memstream persona bot.
#   docker build -t memstream .                 # the runtime image only: no test run, about a minute
#   docker build --target test .                # the whole test suite in a container (about 10 minutes)
#   docker run -d --name isabella -e DISCORD_TOKEN -e OPENAI_API_KEY -v isabella-data:/data memstream
# Your own persona file, mounted read-only and chosen with MEMSTREAM_PERSONA:
#   docker run -d --name ada -e DISCORD_TOKEN -e OPENAI_API_KEY -v ada-data:/data \
#     -v "$PWD/personas/ada.toml:/app/personas/ada.toml:ro" -e MEMSTREAM_PERSONA=/app/personas/ada.toml memstream

# -- build stage: the package as a wheel; both the runtime and the test stage start from it ------------------
FROM python:3.11-slim AS build
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY . /src
RUN pip wheel --no-deps --wheel-dir /wheels .

# -- test stage: only built when asked for (--target test); the suite against the sources -------------------
FROM build AS test
RUN pip install -e ".[test]" && python -m pytest -q -p no:cacheprovider

# -- runtime stage (the default target): the package and its runtime dependencies, a non-root user ----------
FROM python:3.11-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MEMSTREAM_DATA_DIR=/data \
    MEMSTREAM_PERSONA=/app/personas/isabella.toml \
    MEMSTREAM_STATUS_FILE=/tmp/memstream-status
COPY --from=build /wheels /wheels
# The postgres extra too: the same image runs on SQLite (the default) or on PostgreSQL (compose.yaml).
RUN pip install "$(ls /wheels/memstream-*.whl)[postgres]" && rm -rf /wheels \
    && useradd --create-home --uid 10001 persona \
    && mkdir -p /data /app && chown persona:persona /data /app
WORKDIR /app
COPY --chown=persona:persona personas /app/personas
USER persona
VOLUME ["/data"]
# Healthy while the bot's Discord gateway is connected (the bot writes $MEMSTREAM_STATUS_FILE).
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s --retries=3 CMD ["python", "-m", "bot.health"]
# docker stop sends SIGTERM: the bot stores what is queued (5 s at most) and disconnects.
STOPSIGNAL SIGTERM
CMD ["memstream", "bot"]
