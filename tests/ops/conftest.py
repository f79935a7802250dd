"""The op-table rows lower inside mps_backend.export_scope, as export_model's lowerings do: the same programs
(tests/test_export_scope.py), without torch's repeated operator census, executorch's repeated dtype check of one
graph and its re-traces that rewrite nothing."""

from __future__ import annotations

import pytest

from mps_backend.export_scope import export_scope


@pytest.fixture(autouse=True)
def _scope():
    with export_scope():
        yield
