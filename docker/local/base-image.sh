#!/usr/bin/env bash
# Make a Debian bookworm base image locally, for machines that reach no image registry:
#
#   bash docker/local/base-image.sh TAG SCRATCH_DIR
#
# debootstrap (minbase) from the Debian mirror this machine's apt already uses, with this machine's
# apt sources and apt settings (so apt inside images reaches the same mirror), and this machine's CA
# bundle at /etc/ssl/host-ca-certificates.crt (pip and Python's ssl use it: PIP_CERT, SSL_CERT_FILE,
# REQUESTS_CA_BUNDLE). It is kept apart from /etc/ssl/certs, which update-ca-certificates rewrites
# when a package installs ca-certificates. Bookworm's python3 is 3.11, like python:3.11-slim.
# Needs root, debootstrap and a running Docker engine ($DOCKER_HOST).
set -euo pipefail
TAG="${1:?usage: base-image.sh TAG SCRATCH_DIR}"
SCRATCH="${2:?usage: base-image.sh TAG SCRATCH_DIR}"
SUITE="${KBP_BASE_SUITE:-bookworm}"
DOCKER="${DOCKER:-docker}"

mirror() {
    # the first deb URI of the machine's Debian sources (deb822 or one-line format)
    local f uri
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f "$f" ]] || continue
        uri="$(awk '/^URIs:/ {print $2; exit}' "$f")"
        if [[ -n "$uri" && "$uri" != *security* ]]; then echo "$uri"; return; fi
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f "$f" ]] || continue
        uri="$(awk '$1 == "deb" && $0 !~ /security/ {for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}' "$f")"
        if [[ -n "$uri" ]]; then echo "$uri"; return; fi
    done
    echo "http://deb.debian.org/debian"
}

ROOTFS="$SCRATCH/rootfs"
rm -rf "$ROOTFS"
mkdir -p "$SCRATCH"
MIRROR="$(mirror)"
echo "base-image: debootstrap --variant=minbase $SUITE from $MIRROR" >&2
debootstrap --variant=minbase "$SUITE" "$ROOTFS" "$MIRROR" > "$SCRATCH/debootstrap.log" 2>&1 \
    || { tail -n 20 "$SCRATCH/debootstrap.log" >&2; echo "base-image: debootstrap failed (log: $SCRATCH/debootstrap.log)" >&2; exit 1; }

# apt: the machine's enabled sources and its Acquire settings (proxy, registry, snapshot dates)
rm -f "$ROOTFS/etc/apt/sources.list"
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    mkdir -p "$ROOTFS$(dirname "$f")"
    cp "$f" "$ROOTFS$f"
done
for f in /etc/apt/apt.conf.d/*; do
    [[ -f "$f" ]] && grep -q "Acquire" "$f" && cp "$f" "$ROOTFS/etc/apt/apt.conf.d/"
done
# keep images small: no docs, no recommends, no apt caches left in layers
cat > "$ROOTFS/etc/apt/apt.conf.d/90kbp-image" <<'EOF'
APT::Install-Recommends "false";
APT::Install-Suggests "false";
EOF
mkdir -p "$ROOTFS/etc/ssl"
cp /etc/ssl/certs/ca-certificates.crt "$ROOTFS/etc/ssl/host-ca-certificates.crt"
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*

CA=/etc/ssl/host-ca-certificates.crt
tar -C "$ROOTFS" -c . | "$DOCKER" import \
    --change "ENV PIP_CERT=$CA SSL_CERT_FILE=$CA REQUESTS_CA_BUNDLE=$CA LANG=C.UTF-8" \
    --change 'CMD ["/bin/bash"]' \
    - "$TAG" > /dev/null
rm -rf "$ROOTFS"
echo "base-image: $TAG" >&2
