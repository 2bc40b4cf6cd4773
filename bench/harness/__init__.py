"""The harness every benchmark shares; nothing here is specific to one benchmark.

* ``env``        what a results file must name: device, date, versions, command, load;
* ``timing``     the one timer (``measure``), rotation against the cache, spread, GB/s;
* ``compare``    two ways of doing one thing, timed in alternating blocks (and their compiles);
* ``processes``  the same benchmark in fresh processes, their rows merged with their spread;
* ``targets``    a figure against its goal, as one line that says met or NOT met;
* ``tables``     markdown tables;
* ``results``    results files: written whole, a page beside the JSON, runs appended.
"""
