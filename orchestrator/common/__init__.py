"""Shared plumbing: files written whole and JSON by one rule, host facts, CPU pinning, the HTTP
client of the services, trace CSVs cut short, TOML sub-tables."""
