#!/usr/bin/env bash
# `make dist-check`: unpack the tarball into a temp dir, install it into a temp prefix, check
# the desktop files, run the installed binary's --self-test offscreen in a clean environment
# (no venv, no source tree), check that the system has every library the bundled xcb platform
# plugin links, start the installed app on a real X display (Xvfb + openbox, tools/xcb_smoke.py:
# window mapped, screenshot in build/linux/dist-check-xcb.png, closed by the window manager),
# check that a bundle without libllama fails with the engine's "Shared library ... not found"
# error, then uninstall (user data kept, and --purge).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
APP_ID=io.github.lazykv.Chat
VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$ROOT/app/lazykv/__init__.py")
NAME=LazyKV-Chat-$VERSION-linux-$(uname -m)
TARBALL=$ROOT/dist/$NAME.tar.gz
[ -f "$TARBALL" ] || { echo "dist-check: $TARBALL is missing (make dist)" >&2; exit 1; }

TMP=$(mktemp -d "${TMPDIR:-/tmp}/lazykv-dist-check.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
PREFIX=$TMP/prefix
step() { echo "dist-check: $*"; }
fail() { echo "dist-check: FAILED: $*" >&2; exit 1; }
# the bundle must stand alone: no venv on PATH, no PYTHONPATH, a neutral working dir; the user's
# cache stays visible for the default model (XDG dirs for the app's data point into TMP)
# (OMP_WAIT_POLICY=PASSIVE: engine threads sleep instead of spinning when the cores are shared)
clean_env() {
    env -i HOME="$HOME" PATH=/usr/bin:/bin LANG=C.UTF-8 QT_QPA_PLATFORM=offscreen OMP_WAIT_POLICY=PASSIVE \
        ${XDG_CACHE_HOME:+XDG_CACHE_HOME="$XDG_CACHE_HOME"} \
        XDG_CONFIG_HOME="$TMP/xdg/config" XDG_DATA_HOME="$TMP/xdg/data" "$@"
}

step "unpack $(basename "$TARBALL") ($(du -h "$TARBALL" | cut -f1))"
mkdir -p "$TMP/unpack" && tar -C "$TMP/unpack" -xzf "$TARBALL"
PKG=$TMP/unpack/$NAME

step "install into a temp prefix"
(cd "$TMP" && clean_env "$PKG/install.sh" --prefix "$PREFIX") | sed 's/^/    /'
for f in bin/lazykv lib/lazykv-chat/lazykv lib/lazykv-chat/uninstall.sh \
         "share/applications/$APP_ID.desktop" "share/metainfo/$APP_ID.metainfo.xml" \
         "share/icons/hicolor/scalable/apps/$APP_ID.svg" "share/icons/hicolor/48x48/apps/$APP_ID.png" \
         "share/icons/hicolor/512x512/apps/$APP_ID.png"; do
    [ -e "$PREFIX/$f" ] || fail "$f was not installed"
done
grep -qx "Exec=$PREFIX/lib/lazykv-chat/lazykv" "$PREFIX/share/applications/$APP_ID.desktop" \
    || fail "the .desktop entry does not run the installed binary"
if command -v desktop-file-validate >/dev/null; then
    desktop-file-validate "$PREFIX/share/applications/$APP_ID.desktop"
fi
if command -v appstreamcli >/dev/null; then
    appstreamcli validate --no-net --explain "$PREFIX/share/metainfo/$APP_ID.metainfo.xml" | sed 's/^/    /' \
        || fail "AppStream metainfo does not validate"
fi
[ -e "$PREFIX/lib/lazykv-chat/_internal/llama_cpp/lib/libllama.so" ] || fail "the bundle lacks libllama.so"

step "self-test of the installed bundle (offscreen)"
out=$TMP/self-test.txt
(cd "$TMP" && clean_env "$PREFIX/bin/lazykv" --self-test) > "$out" 2> "$TMP/self-test.err" \
    || { cat "$out" "$TMP/self-test.err"; fail "the self-test failed"; }
sed 's/^/    /' "$out"
grep -q "frozen bundle" "$out" || fail "the self-test did not run frozen"
grep -q "native libraries in $PREFIX/lib/lazykv-chat/_internal/llama_cpp/lib" "$out" \
    || fail "the engine was not loaded from the bundle"
grep -qx "self-test passed" "$out" || fail "no 'self-test passed' line"

step "the terminal subcommands of the installed bundle start without a display"
for command in estimate models serve; do
    (cd "$TMP" && clean_env "$PREFIX/bin/lazykv" "$command" --help) > "$TMP/$command.txt" 2>&1 \
        || { cat "$TMP/$command.txt"; fail "lazykv $command --help failed in the bundle"; }
    grep -q "^usage: " "$TMP/$command.txt" || { cat "$TMP/$command.txt"; fail "lazykv $command printed no usage"; }
done
(cd "$TMP" && clean_env "$PREFIX/bin/lazykv" estimate "$(find "${XDG_CACHE_HOME:-$HOME/.cache}/lazykv/models" -name 'SmolLM2*.gguf' | head -n 1)" \
    --ctx 1024 --json) > "$TMP/estimate.json" 2> "$TMP/estimate.err" \
    || { cat "$TMP/estimate.json" "$TMP/estimate.err"; fail "lazykv estimate failed in the bundle"; }
grep -q '"n_gpu_layers"' "$TMP/estimate.json" || fail "lazykv estimate gave no plan"

step "the bundled xcb platform plugin finds what it links from the system"
XCB_PLUGIN=$(find "$PREFIX/lib/lazykv-chat/_internal" -name libqxcb.so | head -n 1)
[ -n "$XCB_PLUGIN" ] || fail "the bundle lacks the xcb platform plugin"
missing_libs=$(LD_LIBRARY_PATH="$(dirname "$XCB_PLUGIN")/../../lib" ldd "$XCB_PLUGIN" | grep "not found" || true)
[ -z "$missing_libs" ] || fail "the xcb plugin needs (tools/sysdeps.sh installs them):
$missing_libs"

step "the installed app on a real X display (xcb, Xvfb + openbox)"
mkdir -p "$ROOT/build/linux"
(cd "$TMP" && clean_env python3 "$ROOT/tools/xcb_smoke.py" --screenshot "$ROOT/build/linux/dist-check-xcb.png" \
    --title '.+ — LazyKV Chat' -- "$PREFIX/bin/lazykv" --ctx 512) | sed 's/^/    /' \
    || fail "the installed app did not show its window under xcb (tools/sysdeps.sh installs Xvfb, openbox, ...)"

step "a bundle without libllama must fail the self-test (the frozen-app trap)"
cp -a "$PREFIX/lib/lazykv-chat" "$TMP/broken"
rm -f "$TMP/broken/_internal/llama_cpp/lib/"libllama*
if (cd "$TMP" && clean_env "$TMP/broken/lazykv" --self-test) > "$TMP/broken.txt" 2>&1; then
    cat "$TMP/broken.txt"; fail "the self-test passed without libllama"
fi
grep -q "Shared library with base name 'llama' not found" "$TMP/broken.txt" \
    || { cat "$TMP/broken.txt"; fail "the missing libllama was not reported"; }
sed -n 's/^self-test FAILED/    self-test FAILED (as it should)/p' "$TMP/broken.txt" | cut -c1-140

step "uninstall keeps user data; --purge deletes it"
mkdir -p "$TMP/xdg/data/lazykv" "$TMP/xdg/config/lazykv"
touch "$TMP/xdg/data/lazykv/conversations.sqlite3" "$TMP/xdg/config/lazykv/settings.json"
clean_env "$PREFIX/lib/lazykv-chat/uninstall.sh" | sed 's/^/    /'
leftover=$(find "$PREFIX" -mindepth 1 ! -type d)
[ -z "$leftover" ] || fail "uninstall left: $leftover"
[ -e "$TMP/xdg/data/lazykv/conversations.sqlite3" ] || fail "uninstall deleted the user's data"
clean_env "$PKG/install.sh" --prefix "$PREFIX" > /dev/null
clean_env "$PREFIX/lib/lazykv-chat/uninstall.sh" --purge | sed 's/^/    /'
[ ! -e "$TMP/xdg/data/lazykv" ] && [ ! -e "$TMP/xdg/config/lazykv" ] || fail "--purge kept the user's data"
[ -z "$(find "$PREFIX" -mindepth 1 ! -type d)" ] || fail "uninstall --purge left files"

step "passed"
