#!/usr/bin/env bash
# System packages iobench's tests and benchmarks use: fio (the reference I/O engine) and
# Chromium (renders the HTML report in tests).  Installed with apt when missing and we are
# root; otherwise we say what is missing and the tests that need it skip.
# IOBENCH_SYSDEPS="fio" limits the list (`make run` needs no browser).
set -u
want=${IOBENCH_SYSDEPS:-fio chromium}
need=()
for tool in $want; do
    command -v "$tool" >/dev/null 2>&1 || need+=("$tool")
done
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "installing system packages: ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null 2>&1 || true
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null 2>&1 \
        || echo "warning: could not install ${need[*]}; tests that need them will skip" >&2
else
    echo "warning: missing ${need[*]} (install them with your package manager); tests that need them will skip" >&2
fi
exit 0
