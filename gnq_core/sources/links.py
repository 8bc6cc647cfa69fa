"""Refusing symbolic links that lead out of the folder a file was given in.

A checkpoint folder or an upload is untrusted: a ``model.safetensors`` or ``data.txt`` that is a
link to ``/etc/passwd`` or a private key would have gnq read (and maybe show) a file nobody gave it.
Links that stay inside the folder are fine, and so is the Hugging Face hub cache layout
(``snapshots/<rev>/file`` -> ``../../blobs/<sha>``).  ``GNQ_ALLOW_LINKS=1`` allows every link.
"""

from __future__ import annotations

import os
from pathlib import Path

from gnq_core.errors import GNQError

__all__ = ["LinkError", "check_folder_links", "check_link"]


class LinkError(GNQError, ValueError):
    """A link leaving its folder; the message is one line naming it."""


def _allowed() -> bool:
    return os.environ.get("GNQ_ALLOW_LINKS", "").strip().lower() in ("1", "true", "yes")


def _hub_blobs(folder: Path) -> Path | None:
    """``<repo>/blobs`` when ``folder`` is ``<repo>/snapshots/<revision>`` of the hub cache."""
    return folder.parent.parent / "blobs" if folder.parent.name == "snapshots" else None


def check_link(path: Path, folder: Path | None = None) -> None:
    """Refuse ``path`` when it resolves outside ``folder`` (default: the folder it is in)."""
    if _allowed():
        return
    folder = Path(os.path.abspath(folder if folder is not None else Path(path).parent))
    target = Path(path).resolve()
    inside = [folder.resolve()] + ([blobs.resolve()] if (blobs := _hub_blobs(folder)) else [])
    if not any(target.is_relative_to(root) for root in inside):
        raise LinkError(f"{path}: a link to {target}, outside {folder}; refused "
                        "(GNQ_ALLOW_LINKS=1 allows it)")


def check_folder_links(folder: Path) -> None:
    """Refuse any entry of ``folder`` that is a link leading out of it."""
    if _allowed():
        return
    for entry in folder.iterdir():
        if entry.is_symlink():
            check_link(entry, folder)
