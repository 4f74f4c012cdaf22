"""Tiered storage: tier config, SQLite catalog, staging modes, eviction policies, lifecycle."""
