"""Example hyper-train adapter for LLaVA (see docs/plugin-guide.md)."""
