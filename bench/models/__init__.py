"""What the benchmarks build and run besides the package itself: model shapes with random
weights, the CLIP baseline, inputs, and how a row's device and memory are measured."""
