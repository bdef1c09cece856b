#!/usr/bin/env bash
# Build "LazyKV Chat.app" and LazyKV-Chat-<version>-macos-<arch>.dmg.
# NOT YET VERIFIED ON macOS (see installers/README.md).
#
# Run from the source tree on macOS 11+ with Python 3.11 and the Xcode command line tools.
# CMAKE_ARGS selects the engine's backend; Metal is llama.cpp's default on Apple silicon.
# Signing: set CODESIGN_IDENTITY ("Developer ID Application: ...") to sign the app; notarize the
# dmg afterwards with `xcrun notarytool submit ... --wait` and `xcrun stapler staple`.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
[ -d .venv ] || python3.11 -m venv .venv
PY=.venv/bin/python
"$PY" native/build.py ensure
"$PY" -m pip install --quiet -e ".[dist]"
"$PY" app/lazykv/core/models/model_fetch.py
VERSION=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' app/lazykv/__init__.py)
BUILD=build/macos
rm -rf "$BUILD/bundle"
"$PY" -m PyInstaller --noconfirm --distpath "$BUILD/bundle" --workpath "$BUILD/work" installers/lazykv.spec
APP="$BUILD/bundle/LazyKV Chat.app"

# the bundle must run before it is packed
QT_QPA_PLATFORM=offscreen "$APP/Contents/MacOS/lazykv" --self-test

if [ -n "${CODESIGN_IDENTITY:-}" ]; then
    codesign --force --deep --options runtime --timestamp --sign "$CODESIGN_IDENTITY" "$APP"
fi
bash installers/macos/make_dmg.sh "$APP" "dist/LazyKV-Chat-$VERSION-macos-$(uname -m).dmg"
