"""``python -m gnq_core.cli``."""

from gnq_core.cli import app

if __name__ == "__main__":  # importing it (pkgutil.walk_packages) runs nothing
    app()
