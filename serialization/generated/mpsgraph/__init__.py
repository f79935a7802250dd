"""flatc bindings of schema.fbs; generated, do not edit."""
