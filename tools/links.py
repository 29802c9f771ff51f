"""Where the project lives, and every link built from it: Binder, Colab, and devlab's install source.

One place says where: `Repository` under `[project.urls]` in pyproject.toml (a GitHub URL).
The ref is the release tag `v{version}`, so a notebook opened from a link and the devlab its
set-up cell installs come from the same commit. With no Repository set there are no links:
the README shows no badge and the Colab set-up cell says devlab cannot be installed yet.

    python -m tools.links            # print the links (or why there are none)
    python -m tools.links --write    # rewrite the README's links block and the set-up cells
                                     # (and build the translations again: python -m tools.i18n build)
    python -m tools.links --help     # this usage
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
README_START = "<!-- links: written by `python -m tools.links --write` from pyproject.toml -->"
README_END = "<!-- /links -->"
_GITHUB = re.compile(r"^https://github\.com/(?P<owner>[\w.-]+)/(?P<name>[\w.-]+?)(?:\.git)?/?$")


@dataclass(frozen=True)
class Home:
    """A public GitHub repository and the ref links point at."""

    owner: str
    name: str
    ref: str

    @property
    def url(self) -> str:
        return f"https://github.com/{self.owner}/{self.name}"

    def binder(self, notebook: str) -> str:
        """mybinder.org: /v2/gh/OWNER/REPO/REF, opening JupyterLab on the notebook."""
        return (f"https://mybinder.org/v2/gh/{self.owner}/{self.name}/{self.ref}"
                f"?urlpath=lab/tree/notebooks/{notebook}")

    def colab(self, notebook: str) -> str:
        """Colab opens a notebook straight from GitHub: /github/OWNER/REPO/blob/REF/PATH."""
        return (f"https://colab.research.google.com/github/{self.owner}/{self.name}/blob/"
                f"{self.ref}/notebooks/{notebook}")

    @property
    def install_source(self) -> str:
        """What the Colab set-up cell gives pip: devlab at the release tag."""
        return f"devlab @ git+{self.url}@{self.ref}"


def project_home(pyproject: Path = ROOT / "pyproject.toml") -> Home | None:
    """The repository named in pyproject.toml's [project.urls], or None while there is none."""
    project = tomllib.loads(pyproject.read_text())["project"]
    url = (project.get("urls") or {}).get("Repository")
    if not url:
        return None
    match = _GITHUB.match(url)
    if not match:
        raise ValueError(f"[project.urls] Repository = {url!r}: Binder and Colab links are "
                         "built for https://github.com/OWNER/REPO repositories only.")
    return Home(match["owner"], match["name"], f"v{project['version']}")


def notebooks() -> list[str]:
    return sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))


def translations(nb: str) -> list[tuple[str, str]]:
    """(language's own name, path under notebooks/) of each translation of `nb` (tools/i18n.py)."""
    from tools.i18n import LANGUAGES

    return [(lang.name, f"{lang.code}/{nb}") for lang in LANGUAGES.values()
            if (NOTEBOOKS / lang.code / nb).exists()]


def readme_block(home: Home | None) -> str:
    """The README's links block, markers included."""
    if home is None:
        body = ("No links yet: the project has no public repository. Once `Repository` is set "
                "under `[project.urls]` in pyproject.toml, `python -m tools.links --write` puts a "
                "Binder and a Colab link for every notebook here.")
    else:
        rows = [f"| `{nb}` | [Binder]({home.binder(nb)}) | [Colab]({home.colab(nb)}) | "
                + " · ".join(f"{name}: [Binder]({home.binder(path)}), [Colab]({home.colab(path)})"
                             for name, path in translations(nb)) + " |"
                for nb in notebooks()]
        body = "\n".join([f"Links open release `{home.ref}` of {home.url}.", "",
                          "| notebook | Binder | Colab | translations |", "|---|---|---|---|",
                          *rows])
    return f"{README_START}\n{body}\n{README_END}"


def readme_with_block(readme: str, home: Home | None) -> str:
    """`readme` with its links block replaced (the markers must be there)."""
    start, end = readme.find(README_START), readme.find(README_END)
    if start < 0 or end < start:
        raise ValueError("README.md has no links block (its start and end markers).")
    return readme[:start] + readme_block(home) + readme[end + len(README_END):]


def parser() -> argparse.ArgumentParser:
    """`python -m tools.links`'s arguments (`--help` prints what they do)."""
    p = argparse.ArgumentParser(
        prog="python -m tools.links",
        description="Print the Binder and Colab links of every notebook (and of each "
                    "translation), built from `Repository` under [project.urls] in "
                    "pyproject.toml at the release tag v{version}; with no Repository set, "
                    "say why there are none.")
    p.add_argument("--write", action="store_true",
                   help="rewrite the README's links block and every notebook's set-up cell, "
                        "then build the translations again (python -m tools.i18n build)")
    return p


def main(argv: list[str]) -> int:
    from tools import colab_cell

    args = parser().parse_args(argv)  # --help prints the help; a wrong argument, a usage error
    home = project_home()
    if args.write:
        readme = ROOT / "README.md"
        readme.write_text(readme_with_block(readme.read_text(), home))
        for nb in notebooks():
            colab_cell.write(NOTEBOOKS / nb, home.install_source if home else None)
        print(f"wrote README.md's links block and the set-up cells of {len(notebooks())} notebooks")
        # The translations carry the same set-up cell (its comments translated): build them again.
        from tools import i18n

        return i18n.main(["build"])
    if home is None:
        print("no links: set Repository under [project.urls] in pyproject.toml")
        return 0
    for nb in notebooks():
        for path in [nb, *(path for _, path in translations(nb))]:
            print(f"{path}\n  Binder: {home.binder(path)}\n  Colab:  {home.colab(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
