"""The core's own plugins: default build stages and the built-in components."""
