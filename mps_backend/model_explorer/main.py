"""Model Explorer extension entry point (``model-explorer --extensions=mps_backend.model_explorer``):
the .pte adapter with MPS delegates expanded. Importing this module registers the MPSBackend handler
with ``pte-adapter-model-explorer`` (a plug-in registration, the only import-time effect)."""

from __future__ import annotations

from model_explorer import Adapter, AdapterMetadata, ModelExplorerGraphs
from pte_adapter_model_explorer.main import PTEAdapter

from mps_backend.model_explorer import register

register()


class MPSPTEAdapter(Adapter):  # Model Explorer registers direct subclasses of Adapter only
    """executorch .pte files, MPSBackend delegates expanded into their MPS node graphs (the .pte adapter
    does the program; the handler :func:`register` installed does each MPS delegate)."""

    metadata = AdapterMetadata(
        id="mps_backend_model_explorer",
        name="PTE adapter (MPS delegates)",
        description="ExecuTorch .pte programs; MPSBackend delegates expand into their MPS node graph",
        fileExts=["pte"],
    )

    def convert(self, model_path: str, settings: dict) -> ModelExplorerGraphs:
        return PTEAdapter().convert(model_path, settings)
