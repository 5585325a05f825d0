# memstream persona bot. Build: docker build -t memstream .
# Run:   docker run -e DISCORD_TOKEN -e OPENAI_API_KEY -v memstream-data:/data memstream \
#            memstream bot --persona personas/isabella.toml
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MEMSTREAM_DATA_DIR=/data

RUN useradd --create-home --uid 10001 persona \
    && mkdir -p /data /app && chown persona:persona /data /app
WORKDIR /app
COPY --chown=persona:persona . /app

USER persona
ENV PATH="/home/persona/.local/bin:${PATH}"
# The README's two set-up steps: install, then run the tests (the build fails if they fail).
RUN pip install --user -e ".[test]" \
    && python -m pytest -q -p no:cacheprovider

VOLUME ["/data"]
CMD ["memstream", "bot", "--persona", "personas/isabella.toml"]
