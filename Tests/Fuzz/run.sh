#!/usr/bin/env bash
# Coverage-guided fuzzing of the pure cores with libFuzzer (swiftc -sanitize=fuzzer,address).
#   bash Tests/Fuzz/run.sh [http1|oauth|http2|resp|signing|credentials|signedresponse|caller|all] [seconds]      default: all, 30 s each
#   FUZZ_RUNS=N: instead of a time limit, N executions from a fixed seed (reproducible; CI)
# Crashing inputs are written to Tests/Fuzz/FailCases/<target>/ (keep them: they are replayed
# as regression inputs on every run before fuzzing starts). The corpus grows in a temporary
# directory seeded from Tests/Fuzz/corpus/<target>/.
set -euo pipefail
# Crashes go to libFuzzer's report; Swift's own backtracer would only slow them down.
export SWIFT_BACKTRACE=enable=no
cd "$(dirname "$0")/../.."
which=${1:-all}
seconds=${2:-30}
out=$(mktemp -d "${TMPDIR:-/tmp}/bearerd-fuzz.XXXXXX")
trap 'rm -rf "$out"' EXIT

build() {  # name, sources...
    local name=$1; shift
    # -package-name: sources use `package` access (one package, as SwiftPM builds them).
    swiftc -sanitize=fuzzer,address -parse-as-library -O -module-name "Fuzz_$name" -package-name bearerd "$@" -o "$out/$name" \
        2>"$out/build-$name.log" || { grep -v "ld.gold: warning" "$out/build-$name.log"; exit 1; }
}

fuzz() {  # name
    local name=$1 fails="Tests/Fuzz/FailCases/$1"
    mkdir -p "$fails" "$out/corpus-$name"
    cp -r "Tests/Fuzz/corpus/$name/." "$out/corpus-$name/" 2>/dev/null || true
    # Regression: every stored failure must pass now.
    if compgen -G "$fails/*" >/dev/null; then
        "$out/$name" -runs=0 "$fails"/* >/dev/null 2>&1 || { echo "fuzz $name: a stored failure case fails again"; exit 1; }
    fi
    local limit=(-max_total_time="$seconds")
    if [ -n "${FUZZ_RUNS:-}" ]; then limit=(-runs="$FUZZ_RUNS" -seed=1); fi
    echo "fuzz $name: ${limit[*]}"
    "$out/$name" "${limit[@]}" -max_len=4096 -timeout=5 -artifact_prefix="$fails/" \
        -print_final_stats=1 "$out/corpus-$name" 2>"$out/$name.log" \
        || { tail -40 "$out/$name.log"; echo "fuzz $name: FAILED (input saved in $fails/)"; exit 1; }
    grep -E "stat::number_of_executed_units|cov:" "$out/$name.log" | tail -2
}

if [ "$which" = all ] || [ "$which" = http1 ]; then
    build http1 Sources/BearerdHTTP/*.swift Tests/Fuzz/HTTP1Fuzz.swift
    fuzz http1
fi
if [ "$which" = all ] || [ "$which" = http2 ]; then
    # The nghttp2 engine links libnghttp2 and imports BearerdHTTP as a module of its own: build
    # that first (instrumented too), then the engine with the fuzz entry.
    mkdir -p "$out/mods"
    swiftc -sanitize=fuzzer,address -parse-as-library -O -module-name BearerdHTTP -emit-module \
        -emit-module-path "$out/mods/BearerdHTTP.swiftmodule" -emit-library -static -o "$out/mods/libBearerdHTTP.a" \
        Sources/BearerdHTTP/*.swift 2>"$out/build-bearerdhttp.log" || { cat "$out/build-bearerdhttp.log"; exit 1; }
    build http2 -I "$out/mods" -I Sources/CNghttp2 Sources/BearerdHTTP2/*.swift Tests/Fuzz/HTTP2Fuzz.swift \
        "$out/mods/libBearerdHTTP.a" -lnghttp2
    fuzz http2
fi
if [ "$which" = all ] || [ "$which" = oauth ]; then
    build oauth Sources/BearerdOAuth/*.swift Tests/Fuzz/OAuthFuzz.swift
    fuzz oauth
fi
if [ "$which" = all ] || [ "$which" = resp ]; then
    build resp Sources/BearerdProxyCore/RESP.swift Tests/Fuzz/RESPFuzz.swift
    fuzz resp
fi
if [ "$which" = all ] || [ "$which" = credentials ]; then
    build credentials Sources/BearerdOAuth/*.swift Tests/Fuzz/CredentialsFuzz.swift
    fuzz credentials
fi
# The signers import BearerdOAuth (CivilTime, the one calendar conversion): build it as a module
# of its own first (instrumented too), once, as the http2 target does with BearerdHTTP.
oauth_module() {
    [ -f "$out/mods/libBearerdOAuth.a" ] && return 0
    mkdir -p "$out/mods"
    swiftc -sanitize=fuzzer,address -parse-as-library -O -module-name BearerdOAuth -package-name bearerd -emit-module \
        -emit-module-path "$out/mods/BearerdOAuth.swiftmodule" -emit-library -static -o "$out/mods/libBearerdOAuth.a" \
        Sources/BearerdOAuth/*.swift 2>"$out/build-bearerdoauth.log" || { cat "$out/build-bearerdoauth.log"; exit 1; }
}
if [ "$which" = all ] || [ "$which" = signing ]; then
    oauth_module
    build signing -I "$out/mods" Sources/BearerdProxyCore/RequestSigning.swift Tests/Fuzz/SigningFuzz.swift "$out/mods/libBearerdOAuth.a"
    fuzz signing
fi
if [ "$which" = all ] || [ "$which" = signedresponse ]; then
    oauth_module
    build signedresponse -I "$out/mods" Sources/BearerdProxyCore/SignedResponseVerdict.swift Tests/Fuzz/SignedResponseFuzz.swift "$out/mods/libBearerdOAuth.a"
    fuzz signedresponse
fi
if [ "$which" = all ] || [ "$which" = caller ]; then
    build caller Sources/BearerdOAuth/*.swift Tests/Fuzz/CallerFuzz.swift
    fuzz caller
fi
