"""Language models: loading (models), model folders and meta.json (modelio), generation,
sampling and token estimates (tokens). Imports farmkit.core only."""
