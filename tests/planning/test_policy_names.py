"""planning.names, the policy names --help lists without importing the planners, against the
registry itself; and the --policy check."""
import pytest

from vr_runtime.planning import names, policies


def test_the_light_names_are_the_registry():
    # A planner registered in policies.py must be named in planning/names.py (and the reverse),
    # or --help would not list it.
    assert names.POLICY_NAMES == policies.policy_names()
    assert names.AUTO == policies.AUTO


def test_check_policy_is_one_line_with_a_suggestion():
    assert policies.check_policy("fragment") == "fragment"
    with pytest.raises(ValueError, match="--policy 'fragmnet': expected one of auto, .*did you "
                                         "mean 'fragment'"):
        policies.check_policy("fragmnet")
