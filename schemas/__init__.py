"""JSON Schemas of the record kinds, shipped as package data (see farmkit.core.validate)."""
