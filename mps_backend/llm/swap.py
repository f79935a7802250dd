"""What the export replaces of transformers' or executorch's code, each replacement scoped and undone.

- :func:`swapped`: functions of transformers' modeling modules swapped for the decode step's forward (the
  one torch.export traces), put back when it returns, also when it raises. Some modeling code calls a
  module-level function the device cannot compute as written, or must see a chunk's padding rows through:
  RoPE as complex numbers (:func:`mps_backend.llm.attention.real_rotary`), the scans that update a recurrent
  state for several rows (:data:`mps_backend.llm.recurrent.CHUNK_SCANS`). Each is a ``(module name, function
  name, wrap)`` swap: ``wrap(own)`` gives the function to use meanwhile.
- :class:`Replacements`: what building a method's module changes of the model for its export (its rotary
  modules replaced by tables, executorch llama's ``kv_cache`` and ``SDPA``, a latent-attention layer's
  ``expand_kv``, the head's forward pre-hook, the attention implementation and transformers' attention
  registry), each recorded as it is made and undone by :meth:`Replacements.undo`: the export undoes them once
  the method is exported, also when it fails, so every method is built from the model as loaded, in any
  order, and an export leaves nothing of itself in the process.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Iterable

import torch

#: (modeling module name, function name, wrap: transformers' own function -> the one to use meanwhile)
Swap = tuple[str, str, Callable[[Callable], Callable]]


def modeling_modules(model) -> frozenset[str]:
    """The names of the modules ``model``'s submodules are defined in."""
    return frozenset(type(m).__module__ for m in model.modules())


@contextlib.contextmanager
def swapped(swaps: Iterable[Swap]):
    """While open, each swap's function of its module is ``wrap(own)``; transformers' own is put back after."""
    saved = []
    try:
        for name, fn, wrap in swaps:
            module = sys.modules[name]
            own = getattr(module, fn)
            saved.append((module, fn, own))
            setattr(module, fn, wrap(own))
        yield
    finally:
        for module, fn, own in reversed(saved):
            setattr(module, fn, own)


def _own(obj: Any, name: str) -> bool:
    """Whether ``name`` is ``obj``'s own attribute (a module's submodule, parameter or buffer included), not
    one it reads from its class."""
    if isinstance(obj, torch.nn.Module) and (name in obj._modules or name in obj._parameters or name in obj._buffers):
        return True
    return name in vars(obj)


class Replacements:
    """Changes made to a model (and to transformers' process-wide attention registry) for one method's
    export, each recorded with how to undo it; :meth:`undo` undoes them, last first. A context manager:
    ``with Replacements() as changes:`` undoes on leaving, also on error."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def __enter__(self) -> Replacements:
        return self

    def __exit__(self, *exc: object) -> None:
        self.undo()

    def __len__(self) -> int:
        return len(self._undo)

    def setattr(self, obj: Any, name: str, value: Any) -> None:
        """``setattr(obj, name, value)`` (a submodule replaced, a method overridden on an instance, a module
        attached); undone by restoring the attribute, or deleting it when ``obj`` had none of its own."""
        had = _own(obj, name)
        old = getattr(obj, name) if had else None
        setattr(obj, name, value)
        self._undo.append(lambda: setattr(obj, name, old) if had else delattr(obj, name))

    def hook(self, handle: Any) -> None:
        """A hook handle (``register_forward_pre_hook``, ...): removed by :meth:`undo`."""
        self._undo.append(handle.remove)

    def attention(self, model: torch.nn.Module, name: str, function: Callable) -> bool:
        """``model`` switched to attention ``function`` registered in transformers' ``AttentionInterface`` as
        ``name`` (process-wide): the registration and each config's attention implementation are undone.
        False (nothing changed) when the model's modeling code does not dispatch through the interface."""
        from transformers import AttentionInterface  # noqa: PLC0415 - transformers, only for its models

        can_set = getattr(model, "_can_set_attn_implementation", None)
        if can_set is None or not can_set() or not hasattr(model, "set_attn_implementation"):
            return False
        registry = AttentionInterface._global_mapping  # what AttentionInterface.register updates
        had, old = name in registry, registry.get(name)
        configs = {id(c): (c, getattr(c, "_attn_implementation_internal", None)) for c in _configs(model)}
        AttentionInterface.register(name, function)

        def undo() -> None:
            for config, implementation in configs.values():
                config._attn_implementation_internal = implementation
            if had:
                registry[name] = old
            else:
                registry.pop(name, None)

        self._undo.append(undo)
        model.set_attn_implementation(name)
        return model.config._attn_implementation == name

    def undo(self) -> None:
        """Undo every change, last first (each once)."""
        while self._undo:
            self._undo.pop()()


def _configs(model: torch.nn.Module) -> list[Any]:
    """Every transformers config of ``model``'s modules and their sub-configs, at any depth."""
    found: list[Any] = []
    todo = [m.config for m in model.modules() if hasattr(m, "config")]
    while todo:
        config = todo.pop()
        if any(config is c for c in found) or not hasattr(config, "sub_configs"):
            continue
        found.append(config)
        todo += [getattr(config, key, None) for key in config.sub_configs if getattr(config, key, None) is not None]
    return found


__all__ = ["Replacements", "Swap", "modeling_modules", "swapped"]
