"""The public API: memstream.__all__ is complete and every name in it is what its module defines."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from types import ModuleType

import memstream
import memstream.errors


def submodules() -> list[ModuleType]:
    """Every public module of memstream, in its packages too (index/, models/, ...)."""
    return [importlib.import_module(info.name) for info in pkgutil.walk_packages(memstream.__path__, "memstream.")
            if not any(part.startswith("_") for part in info.name.split("."))]


def test_all_is_complete() -> None:
    # In the spirit of httpx's tests/test_exported_members.py.
    exported = {name for name in dir(memstream)
                if not name.startswith("_") and not inspect.ismodule(getattr(memstream, name))}
    assert set(memstream.__all__) == exported


def test_all_has_no_duplicates_and_star_import_matches() -> None:
    assert len(memstream.__all__) == len(set(memstream.__all__))
    namespace: dict[str, object] = {}
    exec("from memstream import *", namespace)
    assert {name for name in namespace if name != "__builtins__"} == set(memstream.__all__)


def test_every_export_is_its_module_s_public_name() -> None:
    owners: dict[str, ModuleType] = {}
    for module in submodules():
        for name in getattr(module, "__all__", []):
            assert hasattr(module, name), f"{module.__name__}.__all__ names missing {name}"
            owners.setdefault(name, module)
    for name in memstream.__all__:
        assert name in owners, f"memstream.{name} is not in any submodule's __all__"
        assert getattr(memstream, name) is getattr(owners[name], name)


def test_every_module_declares_all() -> None:
    assert [m.__name__ for m in submodules() if not hasattr(m, "__all__")] == []


def test_errors_are_rooted_and_exported() -> None:
    errors = {name: getattr(memstream.errors, name) for name in memstream.errors.__all__}
    assert all(issubclass(error, memstream.MemstreamError) for error in errors.values())
    assert set(errors) <= set(memstream.__all__)
    assert issubclass(memstream.MissingVariables, memstream.PromptError)
    assert issubclass(memstream.CompletionError, memstream.ProviderError)
    assert issubclass(memstream.EmbeddingError, memstream.ProviderError)
    assert issubclass(memstream.MigrationError, memstream.StoreError)


def test_version_matches_the_distribution() -> None:
    from importlib.metadata import version

    assert memstream.__version__ == version("memstream")
