"""Other tools' archives read as bundles, one module per writer, named after who writes
them (antrea_support.py: ``antctl supportbundle`` output)."""
