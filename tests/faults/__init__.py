"""Fault suite: real servers behind fault proxies, cache calls through Client/TieredCache."""
