"""Snakemake reads configuration files with gradinv's reader, so that they stay data.

Snakemake loads ``configfile:`` and every ``--configfile`` with YTE, a template engine: a file
that says ``__use_yte__: true`` has its ``?...`` expressions evaluated as Python while Snakemake
parses its command line, before the Snakefile (and so before gradinv's validation) runs, and
Snakemake then strips the marker. No Snakemake option turns that off. The guard replaces
``snakemake.common.configfile.load_configfile`` with :func:`gradinv.config_files.read_config_file`
(one reader for Snakemake and ``gradinv validate``), as the module is imported, before Snakemake's
settings bind the function.

It takes effect in every Python process of an environment through a ``.pth`` file in its
site-packages, which ``gradinv guard install`` writes (``make env`` does). The Snakefile checks that
the guard is active and warns when it is not (see :func:`active`); it reads every configuration
file again with the same reader either way, so a bad file is refused in both cases, but without
the guard a YTE file has already been rendered by then. Profiles (``--profile``) are not guarded:
they name the commands that submit jobs and are trusted like the Snakefile.

This module imports only the standard library: the ``.pth`` line imports it at every start-up.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import sysconfig
from pathlib import Path
from types import ModuleType
from typing import Any

TARGET = "snakemake.common.configfile"
PTH_NAME = "gradinv_config_guard.pth"
# One line, run by the site module at start-up; it does nothing where gradinv, or this module
# (an older checkout on the path), is not found.
PTH_LINE = (
    "import importlib.util as _u; _u.find_spec('gradinv') and "
    "_u.find_spec('gradinv.config_guard') and "
    "__import__('gradinv.config_guard').config_guard.install()\n"
)

_PATCHED = "__gradinv_guarded__"


def _patch(module: ModuleType) -> None:
    if getattr(module, _PATCHED, False):
        return
    original = module.load_configfile

    def load_configfile(configpath: Any) -> dict[str, Any]:
        if not isinstance(configpath, (str, Path)):
            return original(configpath)
        from snakemake_interface_common.exceptions import WorkflowError

        from gradinv.config_files import ConfigFileError, read_config_file

        try:
            return read_config_file(configpath)
        except ConfigFileError as err:
            raise WorkflowError(f"gradinv: {err}") from None

    module.load_configfile = load_configfile
    setattr(module, _PATCHED, True)


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the patch, before anyone imports a name from it."""

    def __init__(self, loader: importlib.abc.Loader) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    """Patch Snakemake's loader now if it is imported, else as soon as it is (idempotent)."""
    if TARGET in sys.modules:
        _patch(sys.modules[TARGET])
    elif not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def active() -> bool:
    """Whether Snakemake's configuration files are read by gradinv's reader in this process."""
    module = sys.modules.get(TARGET)
    return bool(module is not None and getattr(module, _PATCHED, False))


def pth_path() -> Path:
    """Where ``gradinv guard install`` writes the ``.pth`` file: this Python's site-packages."""
    return Path(sysconfig.get_paths()["purelib"]) / PTH_NAME


def write_pth() -> Path:
    """Install the guard for every later Python start-up of this environment."""
    path = pth_path()
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(PTH_LINE)
    tmp.replace(path)
    return path
