"""The compatibility matrix (compat/*.yaml): loading, versions, and queries over it."""
