# mcpl-router: the daemon, as a small non-root image.
#
#   docker build -t mcpl-router .
#   docker run --rm -v "$PWD/config/example.toml:/etc/mcpl-router/config.toml:ro" \
#       -v mcpl-router-state:/var/lib/mcpl-router mcpl-router
#
# The config is mounted at /etc/mcpl-router/config.toml; state (journal, host token, socket)
# lives in /var/lib/mcpl-router. stdio servers named in the config must exist inside the image:
# build FROM this image and add them. See docs/container.md.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY mcpl_router ./mcpl_router
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
RUN useradd --system --uid 10001 --create-home --home-dir /var/lib/mcpl-router mcpl
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
ENV MCPL_ROUTER_STATE_DIR=/var/lib/mcpl-router \
    PYTHONUNBUFFERED=1
USER mcpl
WORKDIR /var/lib/mcpl-router
VOLUME ["/var/lib/mcpl-router"]
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s --retries=3 \
    CMD ["mcpl-router", "health", "--config", "/etc/mcpl-router/config.toml"]
# SIGTERM drains: stdio children get stdin closed, then SIGTERM, then SIGKILL.
STOPSIGNAL SIGTERM
ENTRYPOINT ["mcpl-router", "run", "--config", "/etc/mcpl-router/config.toml"]
