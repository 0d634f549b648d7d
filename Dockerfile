# The kamal-proxy image: a static binary FROM scratch, run as the non-root user kamal-proxy,
# with upstream's conventions that Kamal depends on (label, numeric tag, HOME, CMD).
#
# Build it with `bash scripts/image` (or `bash scripts/image --push REPO` for a release). The
# script assembles the build context; it is never the repository root:
#   bin/<arch>/kamal-proxy   the statically linked binary for each TARGETARCH (amd64, arm64)
#   rootfs/                  image/rootfs (etc/passwd, group, nsswitch.conf), the CA bundle at
#                            etc/ssl/certs/ca-certificates.crt, and tmp/ (mode 1777: the
#                            default control socket is /tmp/kamal-proxy.sock)
#   home/kamal-proxy/        .config/kamal-proxy inside, for the kamal-proxy-config volume
FROM scratch

# Set by buildx for each platform; scripts/image passes it to the classic builder.
ARG TARGETARCH

COPY rootfs/ /
# Owned by the user, so a fresh named volume mounted on ~/.config/kamal-proxy inherits it.
COPY --chown=1001:1001 home/kamal-proxy/ /home/kamal-proxy/
COPY bin/${TARGETARCH}/kamal-proxy /usr/local/bin/kamal-proxy

# Kamal's reboot prunes stopped proxy containers by this label.
LABEL org.opencontainers.image.title=kamal-proxy

ENV PATH=/usr/local/bin:/usr/bin:/bin \
    HOME=/home/kamal-proxy
USER kamal-proxy
EXPOSE 80 443
CMD ["kamal-proxy", "run"]
