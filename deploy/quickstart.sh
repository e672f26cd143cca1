#!/usr/bin/env bash
# The README's first command: installs what bearerd needs to build (Debian packages), builds it in
# release mode with the Swift runtime linked in, and runs `bearerd demo` with the arguments given
# (e.g. --port 8080 --upstream-port 9000 --admin-port 9901).
#
# It works as root without sudo (a fresh container or VM) and as a user with sudo; a user without
# either is told what to install. Packages already installed are not installed again, so a second
# run only builds (incrementally) and starts the demo.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(libssl-dev libnghttp2-dev pkg-config ca-certificates)
missing=()
for pkg in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$(id -u)" -eq 0 ]; then
        as_root=()
    elif command -v sudo >/dev/null 2>&1; then
        as_root=(sudo)
    else
        echo "quickstart: these Debian packages are needed: ${missing[*]}" >&2
        echo "quickstart: run this script as root, or install sudo, or install them with: apt-get install ${missing[*]}" >&2
        exit 1
    fi
    echo "== installing ${missing[*]}" >&2
    "${as_root[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

command -v swift >/dev/null 2>&1 || {
    echo "quickstart: swift is not on PATH; install Swift 6 (swift.org) and run this again" >&2
    exit 1
}

echo "== building bearerd (release, Swift runtime linked in)" >&2
# `--static-swift-stdlib` is an option of `swift build`, not of `swift run`.
swift build -c release --static-swift-stdlib --product bearerd
exec "$(swift build -c release --static-swift-stdlib --show-bin-path)/bearerd" demo "$@"
