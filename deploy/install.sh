#!/usr/bin/env bash
# Installs bearerd on a host: the binary, its manual page bearerd(1), and (with --systemd) the
# units of deploy/systemd. Run from the repository root, as root for the default prefix:
#
#   bash deploy/install.sh [--prefix /usr/local] [--binary PATH] [--systemd] [--destdir DIR]
#
# --binary PATH  install this built binary instead of building one (release, static Swift runtime)
# --systemd      also install bearerd.service and bearerd.socket into $DESTDIR/etc/systemd/system
#                and /etc/bearerd/bearerd.yaml.example (never overwriting /etc/bearerd/bearerd.yaml)
# --destdir DIR  stage everything under DIR (packaging, tests)
#
# The manual page is docs/man/bearerd.1, generated from the command-line parser by
# swift-argument-parser's manual plugin (see docs/man/README.md); `man bearerd` reads it.
set -euo pipefail
prefix=/usr/local
binary=
systemd=no
destdir=
while [ "$#" -gt 0 ]; do
    case "$1" in
        --prefix) prefix="$2"; shift 2 ;;
        --binary) binary="$2"; shift 2 ;;
        --systemd) systemd=yes; shift ;;
        --destdir) destdir="$2"; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
cd "$(dirname "$0")/.."
if [ -z "$binary" ]; then
    command -v swift >/dev/null 2>&1 || { echo "install.sh: swift is not on PATH; install Swift 6 or pass --binary" >&2; exit 1; }
    swift build -c release --static-swift-stdlib --product bearerd
    binary="$(swift build -c release --static-swift-stdlib --show-bin-path)/bearerd"
fi
[ -x "$binary" ] || { echo "install.sh: $binary is not an executable" >&2; exit 1; }
install -D -m 0755 "$binary" "$destdir$prefix/bin/bearerd"
install -D -m 0644 docs/man/bearerd.1 "$destdir$prefix/share/man/man1/bearerd.1"
echo "installed $destdir$prefix/bin/bearerd and $destdir$prefix/share/man/man1/bearerd.1"
if [ "$systemd" = yes ]; then
    install -D -m 0644 deploy/systemd/bearerd.service "$destdir/etc/systemd/system/bearerd.service"
    install -D -m 0644 deploy/systemd/bearerd.socket "$destdir/etc/systemd/system/bearerd.socket"
    install -D -m 0644 config.example.yaml "$destdir/etc/bearerd/bearerd.yaml.example"
    echo "installed the units into $destdir/etc/systemd/system and $destdir/etc/bearerd/bearerd.yaml.example"
    if [ "$prefix" != /usr/local ]; then
        echo "note: bearerd.service runs /usr/local/bin/bearerd; edit ExecStart= for $prefix" >&2
    fi
fi
