"""CRON_TABLE documents (the DocScheduler front-end, SPEC §6): validation, storage, and their runs as work of
the engine.

Names are imported lazily: the CSP worker process imports ``radixjobs.documents.services`` and should
not pay for the engine's imports.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixjobs.documents.model import Action, DocumentError, ProcessState, Status, process_task, validate
    from radixjobs.documents.runner import Documents
    from radixjobs.documents.services import ServiceRegistry
    from radixjobs.documents.store import apply, get_document, list_documents, list_processes, overview

_WHERE = {
    "Action": "model", "DocumentError": "model", "ProcessState": "model", "Status": "model",
    "process_task": "model", "validate": "model",
    "Documents": "runner",
    "ServiceRegistry": "services",
    "apply": "store", "get_document": "store", "list_documents": "store", "list_processes": "store",
    "overview": "store",
}

__all__ = [
    "Action",
    "DocumentError",
    "Documents",
    "ProcessState",
    "ServiceRegistry",
    "Status",
    "apply",
    "get_document",
    "list_documents",
    "list_processes",
    "overview",
    "process_task",
    "validate",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'radixjobs.documents' has no attribute {name!r}")
    return getattr(importlib.import_module(f"radixjobs.documents.{module}"), name)
