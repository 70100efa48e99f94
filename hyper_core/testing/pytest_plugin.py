"""pytest plugin of hyper-train: fixtures for plugin authors."""
