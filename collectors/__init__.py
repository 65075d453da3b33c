"""Getting cluster state into a bundle, and reading bundles back (no parsing here)."""
