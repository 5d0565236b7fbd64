"""Contract tooling: compare API schemas and decide which changes old clients survive."""
