"""Tools the model may call: MCP servers (``mcp_config``: which; ``mcp_hub``: connected with the official
SDK on their own thread) and the user's consent to each call (``consent``). No Qt here."""
