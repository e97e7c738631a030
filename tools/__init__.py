"""The farm-* commands: one thin click command per module, all logic lives in farmkit."""
