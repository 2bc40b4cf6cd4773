"""bench_e2e's VideoRouter rows give --router-pool to the Image Router they run
(FixedRelevance(run_routers=True) used to call frame_probs with no pool)."""


def test_bench_rows_pass_the_pool_to_the_scorer():
    import argparse
    from bench.models import e2e_measure
    args = argparse.Namespace(max_new_tokens=2, margin=10, router_pool=4)
    opts = e2e_measure.answer_options(args, 4, 4000, 600, {"policy": "fragment"},
                                      relevant=[True, False, True, False])
    assert opts.scorer.run_routers and opts.scorer.router_pool == 4 and opts.router_pool is None
    assert e2e_measure.used_router_pool([{"router_pool": 4}, {"router_pool": None}]) == 4
    assert e2e_measure.used_router_pool([{"router_pool": None}]) is None
