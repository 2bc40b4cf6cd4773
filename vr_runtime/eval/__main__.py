"""``python -m vr_runtime.eval`` (also under ``accelerate launch``) = ``videorouter eval``."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
