"""Tools the model may run: MCP servers, their configuration, and the terminal's tool loop."""
