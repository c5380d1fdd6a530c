"""Import the project from this checkout without installing it (a GPU machine whose image has
JAX but not this project).

``alodlm_jax`` sits at the repository root under its own name; ``alodlm_convert``,
``alodlm_scoring`` and ``alodlm_prepare`` live in ``convert/``, ``scoring/`` and ``prepare/``
(pyproject's package map), so they are made importable through links of those names in a
temporary folder. An installed copy of a package is used as it is.

Usage, first thing in a script (before any project import)::

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
    import source_tree
    source_tree.use()
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = {"alodlm_convert": "convert", "alodlm_scoring": "scoring", "alodlm_prepare": "prepare"}


def use(root: pathlib.Path = ROOT, packages: dict[str, str] = PACKAGES) -> pathlib.Path:
    """Puts ``root`` (the repository) first on ``sys.path`` and links the ``packages`` (import
    name -> folder of ``root``) that are not importable into a temporary folder on ``sys.path``;
    returns ``root``."""
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    missing = {name: folder for name, folder in packages.items()
               if importlib.util.find_spec(name) is None}
    if missing:
        links = pathlib.Path(tempfile.mkdtemp(prefix="alodlm-source-"))
        for name, folder in missing.items():
            (links / name).symlink_to(root / folder, target_is_directory=True)
        sys.path.insert(1, str(links))
    return root
