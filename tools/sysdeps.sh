#!/bin/sh
# Install what the app and its tests need from the system, when missing:
# - the shared libraries Qt (PySide6) needs, offscreen and on a real X display: the `xcb` platform
#   plugin links the xcb-util family and libxkbcommon-x11 (the list below is what
#   `ldd PySide6/Qt/plugins/platforms/libqxcb.so` and `.../lib/libQt6XcbQpa.so.6` ask for in
#   PySide6 6.11, plus libxcb-xinerama0, which earlier Qt 6 releases link);
#   without libxcb-cursor0 Qt 6.5+ refuses to start on X11 at all;
# - a Secret Service (gnome-keyring on a private D-Bus session) for the OS keyring test;
# - a headless X desktop for the xcb smoke tests (tests/test_xcb_smoke.py, `make dist-check`):
#   Xvfb, the openbox window manager, wmctrl/xwininfo to find and close windows, ImageMagick's
#   `import` for screenshots;
# - ccache, which native/build.py hands to CMake when present: a rebuild of the engine or of the
#   llama.cpp tools after a change to the patch series recompiles only what changed.
# Debian/Ubuntu only; elsewhere it only reports what is missing.
# `sysdeps.sh vulkan` (make vulkan-check): Vulkan's loader and headers, glslc, SPIR-V headers and
# Mesa's drivers (lavapipe: a Vulkan device on the CPU), nothing else.
# `sysdeps.sh doc` (make bench): the Python documentation (python3-doc), the long natural text of the
# recent window's KLD measurement (bench/natural_text.py), nothing else.
set -eu
# apt-get, with sudo when not root
apt_get() {
    if [ "$(id -u)" -eq 0 ]; then apt-get "$@"; else sudo apt-get "$@"; fi
}
# install the packages named, from the distribution (Debian/Ubuntu), or say what is missing
install_only() {
    echo "sysdeps: missing for $1:$2"
    if command -v apt-get >/dev/null 2>&1; then
        apt_get update -qq
        # shellcheck disable=SC2086
        apt_get install -y -qq --no-install-recommends $2 >/dev/null
    else
        echo "sysdeps: install them with your package manager" >&2
        exit 1
    fi
}
if [ "${1:-}" = "doc" ]; then
    ls /usr/share/doc/python3*/html/_sources/faq/*.rst.txt >/dev/null 2>&1 || install_only "the bench's text" " python3-doc"
    exit 0
fi
if [ "${1:-}" = "vulkan" ]; then
    pkgs=""
    for pair in /usr/include/vulkan/vulkan.h:libvulkan-dev /usr/include/spirv/unified1/spirv.hpp:spirv-headers; do
        [ -e "${pair%%:*}" ] || pkgs="$pkgs ${pair#*:}"
    done
    command -v glslc >/dev/null 2>&1 || pkgs="$pkgs glslc"
    command -v vulkaninfo >/dev/null 2>&1 || pkgs="$pkgs vulkan-tools"
    ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || pkgs="$pkgs mesa-vulkan-drivers"
    [ -z "$pkgs" ] && exit 0
    install_only Vulkan "$pkgs"
    exit 0
fi
need=""
pkgs=""
for pair in libEGL.so.1:libegl1 libGL.so.1:libgl1 libxkbcommon.so.0:libxkbcommon0 \
    libfontconfig.so.1:libfontconfig1 libdbus-1.so.3:libdbus-1-3 libglib-2.0.so.0:libglib2.0-0 \
    libX11-xcb.so.1:libx11-xcb1 libxkbcommon-x11.so.0:libxkbcommon-x11-0 \
    libxcb-cursor.so.0:libxcb-cursor0 libxcb-icccm.so.4:libxcb-icccm4 libxcb-image.so.0:libxcb-image0 \
    libxcb-keysyms.so.1:libxcb-keysyms1 libxcb-randr.so.0:libxcb-randr0 \
    libxcb-render-util.so.0:libxcb-render-util0 libxcb-render.so.0:libxcb-render0 \
    libxcb-shape.so.0:libxcb-shape0 libxcb-shm.so.0:libxcb-shm0 libxcb-sync.so.1:libxcb-sync1 \
    libxcb-util.so.1:libxcb-util1 libxcb-xfixes.so.0:libxcb-xfixes0 libxcb-xkb.so.1:libxcb-xkb1 \
    libxcb-xinerama.so.0:libxcb-xinerama0; do
    lib=${pair%%:*}
    ldconfig -p 2>/dev/null | grep -q "$lib" || { need="$need $lib"; pkgs="$pkgs ${pair#*:}"; }
done
[ -z "$pkgs" ] || pkgs="$pkgs fonts-dejavu-core"
for pair in gnome-keyring-daemon:gnome-keyring dbus-run-session:dbus-daemon \
    Xvfb:xvfb openbox:openbox wmctrl:wmctrl xwininfo:x11-utils import:imagemagick; do
    cmd=${pair%%:*}
    command -v "$cmd" >/dev/null 2>&1 || { need="$need $cmd"; pkgs="$pkgs ${pair#*:}"; }
done
# optional: ccache (nothing fails without it; installed with the rest, or alone, where apt-get is)
command -v ccache >/dev/null 2>&1 || pkgs="$pkgs ccache"
if [ -z "$need" ]; then
    case "$pkgs" in
        *ccache*) if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
                      { apt-get update -qq && apt-get install -y -qq --no-install-recommends ccache >/dev/null; } ||
                          echo "sysdeps: ccache not installed (optional: faster engine rebuilds)" >&2
                  fi ;;
    esac
    exit 0
fi
echo "sysdeps: missing:$need"
if command -v apt-get >/dev/null 2>&1; then
    apt_get update -qq
    # dbus-run-session is in dbus-daemon since Debian 12 / Ubuntu 23.04, in dbus before
    case "$pkgs" in
        *dbus-daemon*) apt-cache show dbus-daemon >/dev/null 2>&1 || pkgs=$(echo "$pkgs" | sed 's/dbus-daemon/dbus/') ;;
    esac
    # shellcheck disable=SC2086
    apt_get install -y -qq --no-install-recommends $pkgs >/dev/null
else
    echo "sysdeps: install them with your package manager (Qt 6 runtime libraries with the xcb" \
        "platform's xcb-util libraries, gnome-keyring, dbus, Xvfb, openbox, wmctrl, xwininfo," \
        "ImageMagick)" >&2
    exit 1
fi
