"""Where the app keeps its files, and their modes: the one place that knows the folders.

- config: ``settings.json``, the window's state, the MCP servers, the tools always allowed
  (``LAZYKV_CONFIG_DIR`` overrides it, e.g. for tests);
- data: the conversation database, its snapshots, the local API's cache, the models' fingerprints
  (``LAZYKV_DATA_DIR`` overrides it);
- the app's own files are the owner's only: folders 0700, files 0600 (best effort where the platform's
  ACLs decide instead).
"""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs

APP_DIR_NAME = "lazykv"
SETTINGS_FILE = "settings.json"
DB_FILE = "conversations.sqlite3"
SNAPSHOTS_DIR = "snapshots"
API_CACHE_DIR = "api-cache"
FINGERPRINTS_FILE = "fingerprints.json"
MCP_FILE = "mcp.json"  # the MCP servers, in the "mcpServers" shape of Claude Desktop's mcp.json
TOOL_PERMISSIONS_FILE = "tool-permissions.json"  # the tools the user always allows

PRIVATE_DIR = 0o700
PRIVATE_FILE = 0o600


def config_dir() -> Path:
    """The platform's per-user config folder."""
    override = os.environ.get("LAZYKV_CONFIG_DIR")
    return Path(override) if override else Path(platformdirs.user_config_dir(APP_DIR_NAME, appauthor=False))


def data_dir() -> Path:
    """The platform's per-user data folder."""
    override = os.environ.get("LAZYKV_DATA_DIR")
    return Path(override) if override else Path(platformdirs.user_data_dir(APP_DIR_NAME, appauthor=False))


def api_cache_dir() -> Path:
    """The local API's KV snapshots (the app's Local server and ``lazykv serve`` share it)."""
    return data_dir() / API_CACHE_DIR


def fingerprints_file() -> Path:
    """The models' sha256 cache (core.engine.fingerprint)."""
    return data_dir() / FINGERPRINTS_FILE


def mcp_file() -> Path:
    """The MCP servers the app starts (core.tools.mcp_config)."""
    return config_dir() / MCP_FILE


def tool_permissions_file() -> Path:
    """The tools remembered as "Always allow" (core.tools.consent)."""
    return config_dir() / TOOL_PERMISSIONS_FILE


def private_dir(path: Path, own: bool = False) -> Path:
    """``path``, made if need be with each missing folder above it owner-only (0700, whatever the
    umask); ``own``: the folder is the app's own, so an existing one is made owner-only too (a
    shared folder, e.g. the one an export goes to, is left as it is)."""
    missing = []
    folder = Path(path)
    while not folder.exists() and folder.parent != folder:
        missing.append(folder)
        folder = folder.parent
    for made in reversed(missing):
        made.mkdir(mode=PRIVATE_DIR, exist_ok=True)
        restrict(made, PRIVATE_DIR)
    if own:
        restrict(Path(path), PRIVATE_DIR)
    return Path(path)


def restrict(path: Path, mode: int = PRIVATE_FILE) -> None:
    """Owner-only permissions on one of the app's own files or folders (best effort: e.g. not on
    Windows, where the folder's ACL decides)."""
    try:
        if path.stat().st_mode & 0o777 != mode:
            path.chmod(mode)
    except OSError:
        pass
