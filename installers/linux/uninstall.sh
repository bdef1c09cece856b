#!/usr/bin/env bash
# Uninstall LazyKV Chat: uninstall.sh [--prefix DIR] [--purge]
#
# Removes the app, its link, menu entry and icons from DIR (default: the prefix it was installed
# in, else ~/.local). Your settings and conversations stay unless --purge is given, which also
# deletes ~/.config/lazykv and ~/.local/share/lazykv (the XDG config and data dirs) and the
# snapshot key in the keyring. Models in ~/.cache/lazykv are never touched.
set -euo pipefail
APP_ID=io.github.lazykv.Chat
HERE=$(cd "$(dirname "$0")" && pwd)
if [ -f "$HERE/installed-files" ]; then PREFIX=$(dirname "$(dirname "$HERE")"); else PREFIX=$HOME/.local; fi
PURGE=0
QUIET=0
while [ $# -gt 0 ]; do
    case $1 in
        --prefix) PREFIX=$2; shift 2 ;;
        --prefix=*) PREFIX=${1#--prefix=}; shift ;;
        --purge) PURGE=1; shift ;;
        --quiet) QUIET=1; shift ;;
        -h|--help) sed -n '2,7s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) echo "uninstall.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
APP_DIR=$PREFIX/lib/lazykv-chat

if [ -f "$APP_DIR/installed-files" ]; then
    while IFS= read -r file; do
        case $file in "$PREFIX"/*) rm -f -- "$file" ;; esac  # only what install.sh put under PREFIX
        dir=$(dirname "$file")
        while [ "$dir" != "$PREFIX" ] && rmdir -- "$dir" 2>/dev/null; do dir=$(dirname "$dir"); done
    done < "$APP_DIR/installed-files"
    rm -rf -- "$APP_DIR"
    if [ -f "$PREFIX/share/icons/hicolor/icon-theme.cache" ] && command -v gtk-update-icon-cache >/dev/null; then
        gtk-update-icon-cache -q -t "$PREFIX/share/icons/hicolor" || true
    fi
    [ $QUIET = 1 ] || echo "LazyKV Chat removed from $PREFIX"
elif [ $QUIET = 0 ]; then
    echo "LazyKV Chat is not installed in $PREFIX (no $APP_DIR/installed-files)"
fi

CONFIG=${XDG_CONFIG_HOME:-$HOME/.config}/lazykv
DATA=${XDG_DATA_HOME:-$HOME/.local/share}/lazykv
if [ $PURGE = 1 ]; then
    rm -rf -- "$CONFIG" "$DATA"
    command -v secret-tool >/dev/null && secret-tool clear service lazykv-chat username snapshot-key-v1 2>/dev/null || true
    echo "deleted your settings ($CONFIG) and conversations ($DATA)"
elif [ $QUIET = 0 ] && { [ -e "$CONFIG" ] || [ -e "$DATA" ]; }; then
    echo "kept your settings ($CONFIG) and conversations ($DATA); --purge deletes them"
fi
