#!/usr/bin/env bash
# `make dist`: the PyInstaller one-folder bundle plus desktop integration, packed as
# dist/LazyKV-Chat-<version>-linux-<arch>.tar.gz:
#
#   LazyKV-Chat-<version>-linux-<arch>/
#     install.sh  uninstall.sh  README.txt
#     lazykv/                      the bundle (lazykv executable, _internal/ with Python, Qt, engine)
#     share/applications/<id>.desktop.in, share/metainfo/<id>.metainfo.xml, share/icons/hicolor/...
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
APP_ID=io.github.lazykv.Chat
VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$ROOT/app/lazykv/__init__.py")
NAME=LazyKV-Chat-$VERSION-linux-$(uname -m)
BUILD=$ROOT/build/linux
STAGE=$BUILD/stage/$NAME

cd "$ROOT"
rm -rf "$BUILD/stage" "$BUILD/bundle"
"$PY" -m PyInstaller --noconfirm --log-level WARN --distpath "$BUILD/bundle" --workpath "$BUILD/work" \
    installers/lazykv.spec 2> >(grep -v "required via ctypes not found" >&2)

mkdir -p "$STAGE/share/applications" "$STAGE/share/metainfo"
cp -a "$BUILD/bundle/LazyKV-Chat" "$STAGE/lazykv"
cp installers/linux/install.sh installers/linux/uninstall.sh "$STAGE/"
cp installers/linux/README.txt "$STAGE/README.txt"
sed "s/@APP_ID@/$APP_ID/g" resources/templates/lazykv.desktop.in > "$STAGE/share/applications/$APP_ID.desktop.in"
sed -e "s/@APP_ID@/$APP_ID/g" -e "s/@VERSION@/$VERSION/g" \
    -e "s/@DATE@/$(date -u -d "@$(git log -1 --format=%ct 2>/dev/null || date +%s)" +%Y-%m-%d)/g" \
    resources/templates/metainfo.xml.in > "$STAGE/share/metainfo/$APP_ID.metainfo.xml"
for png in resources/icons/lazykv-*.png; do
    size=${png##*-}; size=${size%.png}
    mkdir -p "$STAGE/share/icons/hicolor/${size}x${size}/apps"
    cp "$png" "$STAGE/share/icons/hicolor/${size}x${size}/apps/$APP_ID.png"
done
mkdir -p "$STAGE/share/icons/hicolor/scalable/apps"
cp resources/icons/lazykv.svg "$STAGE/share/icons/hicolor/scalable/apps/$APP_ID.svg"
chmod +x "$STAGE/install.sh" "$STAGE/uninstall.sh"

mkdir -p dist
tar -C "$BUILD/stage" -czf "dist/$NAME.tar.gz" "$NAME"
echo "dist/$NAME.tar.gz: $(du -h "dist/$NAME.tar.gz" | cut -f1) ($(du -sh "$STAGE" | cut -f1) unpacked)"
