# Redis for the local stack (deploy/compose/compose.yaml): Debian 12's
# redis-server on the same debian:12 base as crewd's image, so that no
# registry is needed (scripts/image.sh makes the base with debootstrap).
# Built by scripts/compose.sh as crew-redis:bookworm.
FROM debian:12
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -qq -y --no-install-recommends redis-server \
      > /dev/null \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && mkdir -p /data && chown redis:redis /data
# The package's user; redis-server needs nothing of root's.
USER redis
WORKDIR /data
EXPOSE 6379
# Reachable from the stack's network (protected mode refuses non-loopback
# clients without a password); the stream lives in memory and in /data,
# which goes with the container: the local stack keeps nothing.
ENTRYPOINT ["/usr/bin/redis-server"]
CMD ["--bind", "0.0.0.0", "--protected-mode", "no", "--dir", "/data", "--save", "", "--appendonly", "no"]
