# Prometheus for the local stack (deploy/compose/compose.yaml): Debian 12's
# prometheus (server and promtool) on the same debian:12 base as crewd's
# image, so that no registry is needed (scripts/image.sh makes the base
# with debootstrap). Built by scripts/compose.sh as crew-prometheus:bookworm.
# The configuration and the rules are mounted, not copied: an edit needs a
# restart, not a rebuild.
FROM debian:12
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -qq -y --no-install-recommends prometheus \
      > /dev/null \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && mkdir -p /prometheus && chown prometheus:prometheus /prometheus
USER prometheus
WORKDIR /prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
