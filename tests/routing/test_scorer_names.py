"""routing.names, the scorers --help lists without importing them, against the registry; and
the --routers check."""
import pytest

from vr_runtime.errors import RouterWeightsError
from vr_runtime.routing import names, scorers
from vr_runtime.routing.routers import check_router_file


def test_the_light_names_are_the_registry():
    # A scorer registered in scorers.py must be named in routing/names.py (and the reverse), or
    # --help would not list it.
    assert list(names.SCORER_NAMES) == scorers.scorer_names()
    assert names.DEFAULT_SCORER == scorers.DEFAULT_SCORER


def test_check_router_file(tmp_path):
    check_router_file(None)
    (tmp_path / "r.safetensors").write_bytes(b"")
    check_router_file(tmp_path / "r.safetensors")
    with pytest.raises(RouterWeightsError, match="--routers '.*nope.safetensors': no such file"):
        check_router_file(str(tmp_path / "nope.safetensors"))
