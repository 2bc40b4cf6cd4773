"""One benchmark a module: ``python -m bench.scripts.bench_<name> --help`` gives its flags."""
