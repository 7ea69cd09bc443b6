"""JSON Schemas (draft 2020-12) shipped as package data; see pipeline/core/schemas.py."""
