import pytest

from bench.harness import processes


@pytest.fixture
def children_in_process(monkeypatch):
    """``children_in_process(main)``: the fresh processes a benchmark starts through
    bench.harness.processes run ``main`` in this process instead (seconds, not an interpreter
    and torch a child); returns the list their command lines are recorded in."""
    def patch(main):
        cmds = []

        def run(cmd):
            cmds.append(cmd)
            main(cmd[3:])   # [python, -m, module, *argv]
            return 0

        monkeypatch.setattr(processes, "run_child", run)
        return cmds
    return patch
