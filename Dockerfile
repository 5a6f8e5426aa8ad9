# mcpl-router: the daemon, as a small non-root image.
#
#   docker build -t mcpl-router .
#   docker run --rm -p 127.0.0.1:7420:7420 -p 127.0.0.1:9464:9464 \
#       -v "$PWD/router.toml:/etc/mcpl-router/config.toml:ro" \
#       -v mcpl-router-state:/var/lib/mcpl-router mcpl-router
#
# The config is mounted at /etc/mcpl-router/config.toml (the image ships config/container.toml
# there); state (journal, host token, host socket) lives in the volume /var/lib/mcpl-router,
# mode 0700. stdio servers named in the config must exist inside the image: build FROM this
# image and add them. See docs/container.md and docs/deploy.md.
#
# HEALTHCHECK is a Docker-format instruction: podman and buildah build OCI images by default,
# which drop it. Build with `--format docker` there, or use the orchestrator's probes on
# /healthz and /readyz (docs/container.md).

# Both stages name Debian's release, so the apt pin below names a version that exists there.
FROM python:3.11-slim-bookworm AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY mcpl_router ./mcpl_router
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim-bookworm
# tini is PID 1: it forwards SIGTERM to the daemon and reaps orphans (the grandchildren a stdio
# server's wrapper leaves behind), which the daemon, not being PID 1, never sees.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini=0.19.0-1+b3 \
    && rm -rf /var/lib/apt/lists/*
# The home directory is outside the state volume, so shell dotfiles never land in it.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/mcpl \
        --shell /usr/sbin/nologin mcpl \
    && install -d -o mcpl -g mcpl -m 0700 /var/lib/mcpl-router
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
COPY config/container.toml /etc/mcpl-router/config.toml
ENV MCPL_ROUTER_STATE_DIR=/var/lib/mcpl-router \
    HOME=/home/mcpl \
    PYTHONUNBUFFERED=1
# Numeric, so an orchestrator's runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
WORKDIR /home/mcpl
VOLUME ["/var/lib/mcpl-router"]
# 7420: the host WebSocket (host.websocket.port); 9464: /healthz, /readyz, /metrics (health.port).
EXPOSE 7420 9464
# Asks /readyz on health.port (no Unix socket, no secret needed): 0 when ready.
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s --retries=3 \
    CMD ["mcpl-router", "health", "--config", "/etc/mcpl-router/config.toml"]
# SIGTERM drains: hosts get daemon/shutdown, open turns end, stdio children get stdin closed,
# then SIGTERM, then SIGKILL.
STOPSIGNAL SIGTERM
ENTRYPOINT ["tini", "--", "mcpl-router", "run", "--config", "/etc/mcpl-router/config.toml"]
