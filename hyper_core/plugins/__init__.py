"""Plugin discovery and the plugin manager."""

from .manager import (
    BUILTIN_PLUGINS,
    ENTRY_POINT_GROUP,
    PluginHost,
    PluginRecord,
    get_plugin_host,
    reset_plugin_host,
)

__all__ = [
    "BUILTIN_PLUGINS",
    "ENTRY_POINT_GROUP",
    "PluginHost",
    "PluginRecord",
    "get_plugin_host",
    "reset_plugin_host",
]
