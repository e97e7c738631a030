"""Language models: loading (models), model folders and meta.json (modelio), generation
and sampling. Imports farmkit.core only (and, lazily, a few helpers noted where used)."""
