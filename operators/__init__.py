"""The MPS op library: one registry keyed by OpOverload, one module per op family."""

from .registry import Lowering, Registry, default_registry

__all__ = ["Lowering", "Registry", "default_registry"]
