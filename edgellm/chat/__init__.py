"""Chat on the template side: chat templates rendered in a resource-limited Jinja sandbox, tool
calls, gpt-oss's harmony format, and the reasoning split (what a thinking model writes apart from
its answer). Imports nothing of the engine core, the server or the TUI."""
