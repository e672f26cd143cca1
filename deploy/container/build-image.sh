#!/usr/bin/env bash
# Builds the bearerd container image with no registry: `FROM scratch` (Containerfile.scratch),
# its root file system staged here from this machine's Debian packages:
#   /usr/local/bin/bearerd   release build with the Swift runtime linked in, stripped
#   the shared libraries it loads (ldd: libssl3, libcrypto, libnghttp2-14, libc, libstdc++, ...)
#   /etc/ssl/certs/ca-certificates.crt (+ OpenSSL's default paths pointing at it)
#   /etc/passwd, /etc/group with the non-root user bearerd (65532), /etc/nsswitch.conf
#   /etc/bearerd (config), /var/lib/bearerd (state_dir, 0700, owned by 65532), /tmp
#
#   bash deploy/container/build-image.sh [TAG]        default TAG: localhost/bearerd:latest
#   BEARERD_BINARY=PATH   use an already built (statically linked runtime) binary
#   BEARERD_SCRATCH=DIR   build in DIR instead of .build (e.g. while `swift test` holds .build)
#
# The multi-stage deploy/container/Containerfile does the same from registry images
# (swift:6.3-bookworm, debian:12-slim) where a registry can be reached.
set -euo pipefail
cd "$(dirname "$0")/../.."
tag=${1:-localhost/bearerd:latest}

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
if ! command -v podman >/dev/null 2>&1; then
    echo "== installing podman" >&2
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends podman >/dev/null
fi
for pkg in ca-certificates binutils; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" \
        || { DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq --no-install-recommends "$pkg" >/dev/null; }
done

binary=${BEARERD_BINARY:-}
if [ -z "$binary" ]; then
    echo "== building bearerd (release, Swift runtime linked in)" >&2
    scratch=${BEARERD_SCRATCH:-.build}
    swift build --scratch-path "$scratch" -c release --static-swift-stdlib --product bearerd >&2
    binary="$(swift build --scratch-path "$scratch" -c release --static-swift-stdlib --show-bin-path)/bearerd"
fi
[ -x "$binary" ] || { echo "build-image: $binary is not an executable" >&2; exit 1; }

stage=$(mktemp -d "${TMPDIR:-/tmp}/bearerd-image.XXXXXX")
trap 'rm -rf "$stage"' EXIT
root=$stage/root
state=$stage/state
# /proc, /dev and /sys are mount points a container runtime fills (the Swift runtime reads the
# command line from /proc/self/cmdline).
mkdir -p "$root"/usr/local/bin "$root"/etc/bearerd "$root"/etc/ssl/certs "$root"/usr/lib/ssl "$root"/tmp \
         "$root"/var/lib "$root"/proc "$root"/dev "$root"/sys "$state/bearerd"
chmod 1777 "$root"/tmp
# state_dir: copied with --chown onto the existing /var/lib, so only bearerd/ changes owner.
chmod 0700 "$state/bearerd"

install -m 0755 "$binary" "$root/usr/local/bin/bearerd"
strip "$root/usr/local/bin/bearerd"

# Every shared object the binary loads, at the path the loader finds it (symlinks resolved to
# the file they name, kept under the name asked for), plus the loader itself.
libs=$(ldd "$binary" | awk '/=> \// { print $3 } /^[[:space:]]*\/[^ ]+ \(0x/ { print $1 }')
[ -n "$libs" ] || { echo "build-image: ldd found no libraries for $binary" >&2; exit 1; }
for lib in $libs; do
    install -D -m 0644 "$(readlink -f "$lib")" "$root$lib"
done
# The dynamic loader must be executable.
for loader in $(ldd "$binary" | awk '/ld-linux/ { print ($3 ~ /^\//) ? $3 : $1 }'); do chmod 0755 "$root$loader"; done
# glibc's usual path aliases (/lib64 → /usr/lib64 ...) as Debian lays them out.
for alias in lib lib64; do
    if [ -L "/$alias" ] && [ -d "$root/usr/$alias" ] && [ ! -e "$root/$alias" ]; then ln -s "usr/$alias" "$root/$alias"; fi
done

# The system trust store, where OpenSSL's default verify paths look (OPENSSLDIR /usr/lib/ssl).
install -m 0644 /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
ln -s /etc/ssl/certs/ca-certificates.crt "$root/usr/lib/ssl/cert.pem"
ln -s /etc/ssl/certs "$root/usr/lib/ssl/certs"

cat > "$root/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/usr/sbin/nologin
bearerd:x:65532:65532:bearerd:/nonexistent:/usr/sbin/nologin
EOF
cat > "$root/etc/group" <<'EOF'
root:x:0:
bearerd:x:65532:
EOF
printf 'passwd: files\ngroup: files\nhosts: files dns\n' > "$root/etc/nsswitch.conf"
chmod 0644 "$root"/etc/passwd "$root"/etc/group "$root"/etc/nsswitch.conf

cp deploy/container/Containerfile.scratch "$stage/Containerfile"
echo "== podman build $tag" >&2
podman build --quiet -f "$stage/Containerfile" -t "$tag" "$stage" >&2
size=$(podman image inspect "$tag" --format '{{.Size}}')
echo "image $tag: $size bytes ($(( size / 1024 / 1024 )) MiB)"
