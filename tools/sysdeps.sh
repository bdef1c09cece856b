#!/bin/sh
# Install the shared libraries Qt (PySide6) needs, even offscreen, when missing.
# Debian/Ubuntu only; elsewhere it only reports what is missing.
set -eu
need=""
for lib in libEGL.so.1 libGL.so.1 libxkbcommon.so.0 libfontconfig.so.1 libdbus-1.so.3 libglib-2.0.so.0; do
    ldconfig -p 2>/dev/null | grep -q "$lib" || need="$need $lib"
done
[ -z "$need" ] && exit 0
echo "sysdeps: missing shared libraries:$need"
if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    $SUDO apt-get install -y -qq --no-install-recommends \
        libegl1 libgl1 libxkbcommon0 libfontconfig1 libdbus-1-3 libglib2.0-0 fonts-dejavu-core >/dev/null
else
    echo "sysdeps: install them with your package manager (Qt 6 runtime libraries)" >&2
    exit 1
fi
