#!/usr/bin/env bash
# make_dmg.sh APP DMG: a compressed disk image holding the app and a link to /Applications.
# NOT YET VERIFIED ON macOS (see installers/README.md).
set -euo pipefail
APP=$1
DMG=$2
STAGE=$(mktemp -d)
trap 'rm -rf "$STAGE"' EXIT
cp -R "$APP" "$STAGE/"
ln -s /Applications "$STAGE/Applications"
mkdir -p "$(dirname "$DMG")"
rm -f "$DMG"
hdiutil create -volname "LazyKV Chat" -srcfolder "$STAGE" -fs HFS+ -format UDZO -ov "$DMG"
echo "$DMG"
