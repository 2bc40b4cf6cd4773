"""Issue 25's done-when: adding a policy, a frame scorer or a backbone is one module plus one
registration. A toy of each is defined here, outside the package, registered through the public
registries, and run through ``videorouter ask`` (the CLI's ``main``, in process); the report
shows that the toy planner, the toy scorer and the toy backbone are the ones that ran."""
import json

import pytest

from vr_runtime import backbones
from vr_runtime.planning import policies
from vr_runtime.routing import scorers
from vr_runtime.backbones.internvl3 import InternVL3Backbone
from vr_runtime.cli import SAMPLE_VIDEO, main
from vr_runtime.report import json_window


# ---------------------------------------------------------------- the three toys (user code)

class ToyBackbone(InternVL3Backbone):
    """The tiny InternVL3 model under a family of its own: a new backbone class."""
    family = "toy-family"
    model_types = ("toy-internvl",)


def toy_plan(T, budget, grid, relevant, w):
    """Even frames at full resolution, odd frames at s0, whatever the scores say."""
    return [w.relevant_window if t % 2 == 0 else w.other_window for t in range(T)]


class ToyScorer(scorers.FrameScorer):
    """Relevant = the first half of the frames; never reads Z nor the routers."""
    name = "toy-scorer"
    needs_z = False
    uses_routers = False

    def score(self, inp):
        T = int(inp.pixel_values.shape[0])
        scores = [float(T - t) for t in range(T)]
        return scorers.FrameScores([t < T // 2 for t in range(T)], scores, self.name,
                                   notes=["toy scorer ran"])


@pytest.fixture
def toys():
    """Registered the way a user registers them; removed afterwards."""
    backbones.register_backbone(ToyBackbone, presets=("toy-tiny",))
    policies.register_planner("toy-plan", needs_relevance=True,
                              description="even frames at s1, odd at s0")(toy_plan)
    scorers.register_scorer("toy-scorer", lambda model_dir, **kw: ToyScorer())
    yield
    backbones.MODEL_TYPES.pop("toy-internvl")
    backbones.PRESETS.pop("toy-tiny")
    policies.PLANNERS.pop("toy-plan")
    scorers.SCORERS.pop("toy-scorer")


def _ask(capsys, *extra):
    rc = main(["ask", str(SAMPLE_VIDEO), "What shape is the red object?", "--model", "toy-tiny",
               "--frames", "4", "--max-new-tokens", "2", "--json", *extra])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(out.out)


def test_a_toy_planner_scorer_and_backbone_run_through_ask(toys, capsys):
    out = _ask(capsys, "--policy", "toy-plan", "--scorer", "toy-scorer")
    rep = out["report"]
    assert isinstance(out["text"], str)
    assert rep["backbone"] == "toy-family"                # the toy backbone class was built
    assert rep["policy"] == "toy-plan"                    # the toy planner planned
    assert rep["scorer"] == "toy-scorer"                  # the toy scorer scored
    assert rep["frame_scores"] == [4.0, 3.0, 2.0, 1.0]
    assert rep["relevant"] == [True, True, False, False]  # a relevance planner: reported
    assert "toy scorer ran" in rep["notes"]               # the scorer's own notes reach it
    assert rep["windows"] == [json_window(w) for w in (1, 4, 1, 4)]   # s1 = 1, s0 = 4


def test_unknown_names_are_one_line_with_a_suggestion(toys, capsys):
    with pytest.raises(SystemExit) as e:
        main(["ask", str(SAMPLE_VIDEO), "q?", "--model", "toy-tiny", "--scorer", "toy-scorr"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "toy-scorer" in err, err


def test_register_backbone_refuses_a_taken_name_or_a_non_backbone():
    with pytest.raises(ValueError, match="model_type 'internvl' is already registered"):
        backbones.register_backbone(ToyBackbone, model_types=("internvl",))
    with pytest.raises(ValueError, match="preset 'tiny' is already registered"):
        backbones.register_backbone(ToyBackbone, presets=("tiny",))
    with pytest.raises(TypeError, match="expected a Backbone subclass"):
        backbones.register_backbone(object)
    assert "toy-internvl" not in backbones.MODEL_TYPES   # a refusal registers nothing
