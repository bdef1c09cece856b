#!/usr/bin/env bash
# Install LazyKV Chat for this user: ./install.sh [--prefix DIR]   (default: ~/.local)
#
#   DIR/lib/lazykv-chat/     the app (with uninstall.sh and the list of installed files)
#   DIR/bin/lazykv           a link to it
#   DIR/share/applications, DIR/share/metainfo, DIR/share/icons/hicolor: the menu entry and icons
#
# Installing again replaces the app and keeps your settings and conversations.
set -euo pipefail
APP_ID=io.github.lazykv.Chat
PREFIX=$HOME/.local
while [ $# -gt 0 ]; do
    case $1 in
        --prefix) PREFIX=$2; shift 2 ;;
        --prefix=*) PREFIX=${1#--prefix=}; shift ;;
        -h|--help) sed -n '2,9s/^# \{0,1\}//p' "$0"; exit 0 ;;
        *) echo "install.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$PREFIX"
PREFIX=$(cd "$PREFIX" && pwd)
APP_DIR=$PREFIX/lib/lazykv-chat
MANIFEST=$APP_DIR/installed-files

if [ -x "$APP_DIR/uninstall.sh" ]; then
    "$APP_DIR/uninstall.sh" --prefix "$PREFIX" --quiet
fi
mkdir -p "$PREFIX/lib" "$PREFIX/bin"
cp -a "$HERE/lazykv" "$APP_DIR"
cp "$HERE/uninstall.sh" "$APP_DIR/uninstall.sh"
ln -sfn "$APP_DIR/lazykv" "$PREFIX/bin/lazykv"

installed=("$PREFIX/bin/lazykv")
desktop=$PREFIX/share/applications/$APP_ID.desktop
mkdir -p "$(dirname "$desktop")"
sed "s|@EXEC@|$APP_DIR/lazykv|g" "$HERE/share/applications/$APP_ID.desktop.in" > "$desktop"
installed+=("$desktop")
while IFS= read -r -d '' file; do
    rel=${file#"$HERE/"}
    mkdir -p "$PREFIX/$(dirname "$rel")"
    cp "$file" "$PREFIX/$rel"
    installed+=("$PREFIX/$rel")
done < <(find "$HERE/share/metainfo" "$HERE/share/icons" -type f -print0)
printf '%s\n' "${installed[@]}" > "$MANIFEST"

# refresh the icon cache only where one exists already (without a cache
# the desktop reads the icon folders directly; menus watch share/applications themselves)
if [ -f "$PREFIX/share/icons/hicolor/icon-theme.cache" ] && command -v gtk-update-icon-cache >/dev/null; then
    gtk-update-icon-cache -q -t "$PREFIX/share/icons/hicolor" || true
fi

echo "LazyKV Chat installed in $APP_DIR"
echo "  start it from the applications menu or with $PREFIX/bin/lazykv"
case ":$PATH:" in *":$PREFIX/bin:"*) ;; *) echo "  ($PREFIX/bin is not on your PATH)" ;; esac
echo "  uninstall: $APP_DIR/uninstall.sh  (add --purge to delete your settings and conversations too)"
