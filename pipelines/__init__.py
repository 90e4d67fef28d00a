"""Pipeline definitions; compiled YAML lives beside them and is committed."""
