#!/bin/sh
# The Debian base image every Tideline image is built FROM (docker/tideline.Dockerfile), made
# locally with debootstrap and `docker import` instead of pulled: on machines of the kind Tideline
# is tested on, and at air-gapped sites, no image registry is reachable, but a Debian package
# mirror is. It is made the same way everywhere, so CI builds on the base users build on.
#
#   docker/base-image.sh            make the base unless the engine already has it
#   docker/base-image.sh --rebuild  make it again (e.g. to pick up Debian's security updates)
#
# Needs root (debootstrap), debootstrap (make setup installs it) and a Docker engine that answers
# (docker/engine.sh start). The image's apt sources are this host's own Debian sources (the
# bookworm, bookworm-updates and bookworm-security entries of /etc/apt/sources.list.d/debian.sources
# or /etc/apt/sources.list), so builds install packages from the mirror this host uses.
set -eu

image=tideline-debian:bookworm
suite=bookworm

if [ "${1:-}" != --rebuild ] && docker image inspect "$image" > /dev/null 2>&1; then
    echo "base-image: $image exists"
    exit 0
fi
docker info > /dev/null 2>&1 || { echo "base-image: no Docker engine answers: start one (docker/engine.sh start)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "base-image: debootstrap needs root (sudo $0)" >&2; exit 1; }
command -v debootstrap > /dev/null || { echo "base-image: debootstrap not found: install Debian's debootstrap (make setup)" >&2; exit 1; }

# This host's Debian entries for the suite (and its -updates and -security), in the host's own format.
deb822=/etc/apt/sources.list.d/debian.sources
if [ -s "$deb822" ]; then
    format=deb822
    sources=$(awk -v suite="$suite" 'BEGIN { RS = ""; ORS = "\n\n" }
        { for (i = 1; i <= NF; i++) if ($i == "Suites:") for (j = i + 1; j <= NF && $j !~ /:$/; j++)
              if ($j == suite || $j == suite "-updates" || $j == suite "-security") { print; next } }' "$deb822")
    mirror=$(printf '%s\n' "$sources" | awk -v suite="$suite" 'BEGIN { RS = "" }
        $0 ~ "Suites:[^\n]*[ \t]" suite "([ \t]|\n|$)" { for (i = 1; i <= NF; i++) if ($i == "URIs:") { print $(i + 1); exit } }')
else
    format=one-line
    sources=$(grep -E "^deb[ \t]+(\[[^]]*\][ \t]+)?[^ \t]+[ \t]+$suite(-updates|-security)?[ \t]" /etc/apt/sources.list || true)
    mirror=$(printf '%s\n' "$sources" | sed -E 's/\[[^]]*\][ \t]+//' | awk -v suite="$suite" '$3 == suite { print $2; exit }')
fi
[ -n "$mirror" ] || { echo "base-image: no '$suite' entry in this host's apt sources to take the mirror from" >&2; exit 1; }

rootfs=$(mktemp -d /var/tmp/tideline-debian.XXXXXX)
trap 'rm -rf "$rootfs"' EXIT
echo "base-image: debootstrap --variant=minbase $suite from $mirror"
debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" > "$rootfs.log" 2>&1 \
    || { tail -n 20 "$rootfs.log" >&2; rm -f "$rootfs.log"; exit 1; }
rm -f "$rootfs.log"

if [ "$format" = deb822 ]; then
    printf '%s\n' "$sources" > "$rootfs/etc/apt/sources.list.d/debian.sources"
    : > "$rootfs/etc/apt/sources.list"
else
    printf '%s\n' "$sources" > "$rootfs/etc/apt/sources.list"
fi
# Packages installed during an image build must not try to start their services (there is no init).
printf '#!/bin/sh\nexit 101\n' > "$rootfs/usr/sbin/policy-rc.d"
chmod 0755 "$rootfs/usr/sbin/policy-rc.d"
# Images keep no package caches or indexes (a build runs apt-get update itself).
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' > "$rootfs/etc/apt/apt.conf.d/90tideline-no-recommends"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*

tar --numeric-owner -C "$rootfs" -c . | docker import \
    --change 'ENV LANG=C.UTF-8' --change 'CMD ["bash"]' \
    --message "debootstrap --variant=minbase $suite" - "$image" > /dev/null
echo "base-image: built $image"
