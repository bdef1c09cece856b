# Build the Windows installer. NOT YET VERIFIED ON WINDOWS (see installers/README.md).
# Run from the source tree in PowerShell, with Python 3.11, Visual Studio Build Tools (C++),
# CMake and Inno Setup 6 (iscc on PATH). $env:CMAKE_ARGS selects a GPU engine, e.g. "-DGGML_CUDA=on".
$ErrorActionPreference = "Stop"
$Root = Resolve-Path "$PSScriptRoot\..\.."
Set-Location $Root
if (-not (Test-Path .venv)) { py -3.11 -m venv .venv }
$Py = ".venv\Scripts\python.exe"
& $Py native\build.py ensure
& $Py -m pip install --quiet -e ".[dist]"
& $Py app\lazykv\core\models\model_fetch.py
& $Py -m PyInstaller --noconfirm --distpath build\windows\bundle --workpath build\windows\work installers\lazykv.spec
# the bundle must run before it is packed: lazykv-cli.exe is the console twin of lazykv.exe
$env:QT_QPA_PLATFORM = "offscreen"
& build\windows\bundle\LazyKV-Chat\lazykv-cli.exe --self-test
if ($LASTEXITCODE -ne 0) { throw "the bundle's self-test failed" }
Remove-Item Env:QT_QPA_PLATFORM
& $Py -c "from PIL import Image; Image.open('resources/icons/lazykv-256.png').save('build/windows/lazykv.ico', sizes=[(16,16),(24,24),(32,32),(48,48),(64,64),(128,128),(256,256)])"
$Version = (Select-String -Path app\lazykv\__init__.py -Pattern '__version__ = "(.+)"').Matches[0].Groups[1].Value
iscc "/DAppVersion=$Version" installers\windows\lazykv.iss
