#!/bin/sh
# Install what the app and its tests need from the system, when missing:
# the shared libraries Qt (PySide6) needs, even offscreen, and a Secret Service
# (gnome-keyring on a private D-Bus session) for the OS keyring test.
# Debian/Ubuntu only; elsewhere it only reports what is missing.
set -eu
need=""
pkgs=""
for pair in libEGL.so.1:libegl1 libGL.so.1:libgl1 libxkbcommon.so.0:libxkbcommon0 \
    libfontconfig.so.1:libfontconfig1 libdbus-1.so.3:libdbus-1-3 libglib-2.0.so.0:libglib2.0-0; do
    lib=${pair%%:*}
    ldconfig -p 2>/dev/null | grep -q "$lib" || { need="$need $lib"; pkgs="$pkgs ${pair#*:}"; }
done
[ -z "$pkgs" ] || pkgs="$pkgs fonts-dejavu-core"
for pair in gnome-keyring-daemon:gnome-keyring dbus-run-session:dbus-daemon; do
    cmd=${pair%%:*}
    command -v "$cmd" >/dev/null 2>&1 || { need="$need $cmd"; pkgs="$pkgs ${pair#*:}"; }
done
[ -z "$need" ] && exit 0
echo "sysdeps: missing:$need"
if command -v apt-get >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    # dbus-run-session is in dbus-daemon since Debian 12 / Ubuntu 23.04, in dbus before
    case "$pkgs" in
        *dbus-daemon*) apt-cache show dbus-daemon >/dev/null 2>&1 || pkgs=$(echo "$pkgs" | sed 's/dbus-daemon/dbus/') ;;
    esac
    # shellcheck disable=SC2086
    $SUDO apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
else
    echo "sysdeps: install them with your package manager (Qt 6 runtime libraries, gnome-keyring, dbus)" >&2
    exit 1
fi
