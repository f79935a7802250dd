"""flatc bindings of mobile_bytecode.fbs; generated, do not edit."""
