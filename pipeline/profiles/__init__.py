"""Profiles are data: one JSON file per package generation (see docs/profiles.md)."""
