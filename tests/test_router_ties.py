"""integration/judges/router_ties.py on the CPU, on dp_e2e.py's own seeded checkpoint: a divergence
at a near tie of the routed layer's top-k experts is a tie; a wrong token, or the swapped expert's
token where the router is decided, is not."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the integration package, from the checkout
from integration import dp_e2e  # noqa: E402
from integration.judges.router_ties import RouterReplay  # noqa: E402
from integration.models.prompts import make_prompts  # noqa: E402
from integration.models.tiny_model import save_tiny_deepseek_v3  # noqa: E402

STEPS = 8


@pytest.fixture(scope="module")
def walk(tmp_path_factory):
    """float64's greedy tokens for one of the check's prompts, and the replay of every step (float64
    forwards of the checkpoint: the tests that read it are slow)."""
    router = RouterReplay(dp_e2e.moe_checkpoint(tmp_path_factory.mktemp("moe"), 16))
    prompt = dp_e2e.phases()["alone"]["prompts"][0]
    path: list[int] = []
    for step in range(STEPS):
        path.append(router.replay(prompt, path + [0], step).greedy)
    return router, prompt, path, [router.replay(prompt, path, step) for step in range(STEPS)]


@pytest.mark.slow
def test_the_replay_follows_float64_and_its_noise_is_bf16_s(walk):
    router, prompt, path, seen = walk
    with torch.no_grad():
        logits = router.exact(torch.tensor([prompt + path[:3]])).logits[0, -1]
    assert seen[3].greedy == path[3] == int(logits.argmax())
    assert all(0 < s.noise < 0.2 and s.margin >= 0 for s in seen)  # bf16 moves scores of ~0.5 by far less than 1


@pytest.mark.slow
def test_ours_taking_the_swapped_expert_s_token_at_a_near_tie_is_a_tie_either_way_round(walk):
    router, prompt, path, seen = walk
    step = min(range(STEPS), key=lambda k: seen[k].margin / seen[k].noise)
    tie = seen[step]
    assert tie.margin < tie.noise and tie.swapped != tie.greedy  # the seeded checkpoint has one in 8 steps
    ours = path[:step] + [tie.swapped]
    left, notes = router.explain([prompt], [ours], [path], [(0, step, STEPS)])
    assert left == [] and "a router tie" in notes[0]
    # The reference on the swapped side, ours on float64's: a tie too.
    theirs = path[:step] + [tie.swapped] + path[step + 1 :]
    left, _ = router.explain([prompt], [path], [theirs], [(0, step, STEPS)])
    assert left == []


@pytest.mark.slow
def test_a_wrong_token_at_a_near_tie_and_the_swapped_token_where_the_router_is_decided_fail(walk):
    router, prompt, path, seen = walk
    near = min(range(STEPS), key=lambda k: seen[k].margin / seen[k].noise)
    wrong = next(t for t in range(2048) if t not in (seen[near].greedy, seen[near].swapped))
    left, notes = router.explain([prompt], [path[:near] + [wrong]], [path], [(0, near, STEPS)])
    assert left == [(0, near, STEPS)] and "not a router tie" in notes[0]
    decided = [k for k in range(STEPS) if seen[k].margin > seen[k].noise and seen[k].swapped != seen[k].greedy]
    assert decided  # most steps route clearly
    step = decided[0]
    left, _ = router.explain([prompt], [path[:step] + [seen[step].swapped]], [path], [(0, step, STEPS)])
    assert left == [(0, step, STEPS)]


def test_a_checkpoint_whose_earlier_layers_route_is_refused(tmp_path):
    path = save_tiny_deepseek_v3(tmp_path / "all_routed", heads=16, **{**dp_e2e.MOE, "dense_layers": 0})
    with pytest.raises(ValueError, match="only the last layer routed"):
        RouterReplay(path).replay(make_prompts(0)[1], [1, 2], 1)
