; Inno Setup script for LazyKV Chat on Windows. NOT YET VERIFIED ON WINDOWS (see installers/README.md).
;
; Build the one-folder bundle first, on Windows, from the source tree:
;   py -3.11 -m venv .venv && .venv\Scripts\python native\build.py ensure
;   .venv\Scripts\python -m pip install -e ".[dist]"
;   .venv\Scripts\python -m PyInstaller --noconfirm --distpath build\windows\bundle --workpath build\windows\work installers\lazykv.spec
; then compile this script (Inno Setup 6):
;   iscc /DAppVersion=0.1.0 installers\windows\lazykv.iss
; giving dist\LazyKV-Chat-0.1.0-windows-x64-setup.exe. It installs per user (no admin rights) into
; %LOCALAPPDATA%\Programs\LazyKV Chat; the uninstaller leaves the settings (%LOCALAPPDATA%\lazykv)
; and conversations (%LOCALAPPDATA%\lazykv) unless the user ticks the box to delete them.

#ifndef AppVersion
  #define AppVersion "0.1.0"
#endif
#define AppName "LazyKV Chat"
#define AppExe "lazykv.exe"
; the source tree, seen from installers\windows
#define Root "..\.."
#define Bundle Root + "\build\windows\bundle\LazyKV-Chat"

[Setup]
AppId={{6C1E5A8F-3B7D-4E2A-9C41-1A7F0D2B9E63}
AppName={#AppName}
AppVersion={#AppVersion}
AppPublisher=LazyKV
DefaultDirName={autopf}\{#AppName}
DefaultGroupName={#AppName}
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir={#Root}\dist
OutputBaseFilename=LazyKV-Chat-{#AppVersion}-windows-x64-setup
SetupIconFile={#Root}\build\windows\lazykv.ico
UninstallDisplayIcon={app}\{#AppExe}
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
Source: "{#Bundle}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{group}\{#AppName}"; Filename: "{app}\{#AppExe}"
Name: "{group}\Uninstall {#AppName}"; Filename: "{uninstallexe}"
Name: "{autodesktop}\{#AppName}"; Filename: "{app}\{#AppExe}"; Tasks: desktopicon

[Run]
Filename: "{app}\{#AppExe}"; Description: "{cm:LaunchProgram,{#AppName}}"; Flags: nowait postinstall skipifsilent

[Code]
// platformdirs on Windows: user_config_dir and user_data_dir are both %LOCALAPPDATA%\lazykv
procedure CurUninstallStepChanged(CurUninstallStep: TUninstallStep);
var
  DataDir: String;
begin
  if CurUninstallStep = usPostUninstall then
  begin
    DataDir := ExpandConstant('{localappdata}\lazykv');
    if DirExists(DataDir) and not UninstallSilent() then
      if MsgBox('Also delete your LazyKV Chat settings and conversations in ' + DataDir + '?',
                mbConfirmation, MB_YESNO or MB_DEFBUTTON2) = IDYES then
        DelTree(DataDir, True, True, True);
  end;
end;
