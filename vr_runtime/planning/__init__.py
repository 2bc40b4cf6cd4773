"""Planning: how a request's visual-token budget is spent.

* :mod:`.budget`: the exact budget B = L_max - L_text - L_gen - eps and the paper's plans;
* :mod:`.scales`: the pooling windows (s_g, s_1, s_0) a request may change;
* :mod:`.policies`: the planner registry (Global, Fragment, the baselines);
* :mod:`.cost_model` and :mod:`.latency`: per-stage cost on a device, and the largest budget
  whose predicted TTFT fits a target (beyond the paper)."""
