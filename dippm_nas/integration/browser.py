"""Headless Chromium, for looking at a report as a person would: the rendered DOM, or a screenshot."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from dippm_nas._folders import make_parent
from dippm_nas.errors import DippmError

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars", "--virtual-time-budget=8000")


def chromium() -> str:
    """The path of the first Chromium or Chrome on PATH; a DippmError saying how to install one if none is."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    raise DippmError("no Chromium found; install it (Debian: apt-get install chromium) to render reports.")


def _run(html_file: Path, *extra: str, timeout: float = 180) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *extra,
                               Path(html_file).resolve().as_uri()], capture_output=True, text=True, timeout=timeout)


def rendered_dom(html_file: str | Path) -> str:
    """The page's DOM after its scripts ran (Plotly draws its points then)."""
    return _run(Path(html_file), "--dump-dom").stdout


def screenshot(html_file: str | Path, png: str | Path, width: int = 1300, height: int = 2600) -> Path:
    """Render the page in a ``width`` x ``height`` pixel window into ``png`` and return its absolute path.

    Raises DippmError when Chromium wrote no file.
    """
    png = Path(png).resolve()
    make_parent(png, "the screenshot")
    _run(Path(html_file), f"--screenshot={png}", f"--window-size={width},{height}")
    if not png.exists():
        raise DippmError(f"Chromium wrote no screenshot to {png}")
    return png
