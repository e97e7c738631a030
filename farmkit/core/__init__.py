"""The plumbing: records read, checked and written (io, records, validate, formats),
seeds, splits, run folders, processes and endpoints. Imports nothing of farmkit above it."""
